h=$(python3 -c 'import pwd, sys; print(pwd.getpwnam(sys.argv[1]).pw_dir)' deploy) || exit 1
f="$h/.ssh/authorized_keys"
[ -f "$f" ] || { echo "@@deauthorized"; exit 0; }
grep -vF -- llmfleet-transfer-0123abcd "$f" > "$f.llmfleet.tmp"
cat "$f.llmfleet.tmp" > "$f" && rm -f "$f.llmfleet.tmp" || exit 1
if grep -qF -- llmfleet-transfer-0123abcd "$f"; then exit 1; fi
echo "@@deauthorized"
