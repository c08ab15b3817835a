llmfleet_model_tree() {
    # DIR DEPTH: "@@file SIZE MTIME REL" per regular file under DIR (REL from $LLM_TOP)
    [ "$2" -le 8 ] || return 0
    for llm_f in "$1"/* "$1"/.[!.]* "$1"/..?*; do
        [ -e "$llm_f" ] || continue
        [ "$LLM_N" -lt 10000 ] || { echo "@@tree-cut"; return 0; }
        if [ -d "$llm_f" ]; then
            llmfleet_model_tree "$llm_f" $(($2 + 1))
        elif [ -f "$llm_f" ]; then
            LLM_N=$((LLM_N + 1))
            printf '@@file %s %s\n' "$(stat -L -c '%s %Y' -- "$llm_f" 2>/dev/null)" "${llm_f#"$LLM_TOP"/}"
        fi
    done
}
llmfleet_model_manifest() {
    # MODEL_PATH: the model's kind, its manifest, its files' size and mtime
    llm_p=$1
    LLM_N=0
    if [ -d "$llm_p" ]; then
        echo "@@kind dir"
        LLM_TOP=$llm_p
        llmfleet_model_tree "$llm_p" 1
    elif [ -f "$llm_p" ]; then
        echo "@@kind file"
        printf '@@file %s %s\n' "$(stat -L -c '%s %Y' -- "$llm_p" 2>/dev/null)" "${llm_p##*/}"
    elif [ -e "$llm_p" ]; then
        echo "@@kind other"
    else
        echo "@@kind missing"
    fi
    if [ -f "$llm_p.llmfleet.json" ]; then
        echo "@@manifest begin"
        head -c 4194305 -- "$llm_p.llmfleet.json" 2>&1
        echo
        echo "@@manifest end"
    else
        echo "@@manifest none"
    fi
}
part=/srv/models/qwen.llmfleet.part
[ -d "$part" ] || exit 1
LLM_N=0
LLM_TOP=$part
llmfleet_model_tree "$part" 1 | while read -r _ size _mtime rel; do
    printf '@@hash %s %s %s\n' "$size" "$(sha256sum -- "$part/$rel" | cut -c1-64)" "$rel"
done
