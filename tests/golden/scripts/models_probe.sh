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
llmfleet_model_manifest '/srv/models/m it'"'"'s.gguf'
part='/srv/models/m it'"'"'s.gguf.llmfleet.part'
if [ -d "$part" ]; then
    echo "@@part-kind dir"
    LLM_N=0
    LLM_TOP=$part
    llmfleet_model_tree "$part" 1 | while IFS= read -r l; do printf '@@part %s\n' "${l#@@file }"; done
elif [ -f "$part" ]; then
    echo "@@part-kind file"
    printf '@@part %s %s\n' "$(stat -c '%s %Y' -- "$part")" 'm it'"'"'s.gguf'
else
    echo "@@part-kind none"
fi
if [ -f '/srv/models/m it'"'"'s.gguf.llmfleet.part.want' ]; then echo "@@want $(head -c 200 -- '/srv/models/m it'"'"'s.gguf.llmfleet.part.want')"; fi
d='/srv/models/m it'"'"'s.gguf'
while [ -n "$d" ] && [ ! -d "$d" ]; do d=${d%/*}; done
[ -n "$d" ] || d=/
echo "@@fs $d"
df -Pk -- "$d" 2>/dev/null | tail -n 1 | while read -r _fs _total _used avail _rest; do echo "@@avail-kib $avail"; done
for t in sha256sum python3 stat truncate; do
    if command -v "$t" >/dev/null 2>&1; then echo "@@tool $t yes"; else echo "@@tool $t no"; fi
done
echo "@@probe-done"
