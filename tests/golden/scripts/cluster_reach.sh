bad=0
err=$(timeout 3 bash -c 'exec 3<>/dev/tcp/10.0.0.12/50052' 2>&1 </dev/null); rc=$?
err=$(printf '%s' "$err" | tr '\n' ' ' | cut -c1-200)
case "$rc:$err" in
  0:*) echo '@@reach 0 ok' ;;
  124:*|137:*) echo '@@reach 0 timeout'; bad=1 ;;
  126:*|127:*) echo "@@reach 0 unchecked $err" ;;
  *[Rr]efused*) echo '@@reach 0 refused'; bad=1 ;;
  *[Nn]o\ route*|*[Uu]nreachable*) echo "@@reach 0 unreachable $err"; bad=1 ;;
  *) echo "@@reach 0 error $err"; bad=1 ;;
esac
err=$(timeout 3 bash -c 'exec 3<>/dev/tcp/fd00::12/50052' 2>&1 </dev/null); rc=$?
err=$(printf '%s' "$err" | tr '\n' ' ' | cut -c1-200)
case "$rc:$err" in
  0:*) echo '@@reach 1 ok' ;;
  124:*|137:*) echo '@@reach 1 timeout'; bad=1 ;;
  126:*|127:*) echo "@@reach 1 unchecked $err" ;;
  *[Rr]efused*) echo '@@reach 1 refused'; bad=1 ;;
  *[Nn]o\ route*|*[Uu]nreachable*) echo "@@reach 1 unreachable $err"; bad=1 ;;
  *) echo "@@reach 1 error $err"; bad=1 ;;
esac
if [ "$bad" != 0 ]; then exit 3; fi
