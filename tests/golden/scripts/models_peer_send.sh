tail -c +1025 -- '/srv/models/m it'"'"'s.gguf' | python3 -c 'import os, sys, time
limit = int(sys.argv[1])
chunk = 1 << 20 if limit <= 0 else max(4096, min(1 << 20, limit // 10))
t0 = shown = time.monotonic()
sent = 0
while True:
    b = os.read(0, chunk)
    if not b:
        break
    if limit > 0:
        ahead = (sent + len(b)) / limit - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    view = memoryview(b)
    try:
        while view:
            view = view[os.write(1, view):]
    except BrokenPipeError:
        sys.stderr.write("@@sent %d\n" % sent)
        sys.exit(1)  # ssh ended: its own message says why
    sent += len(b)
    if time.monotonic() - shown > 0.25:
        shown = time.monotonic()
        sys.stderr.write("@@sent %d\n" % sent)
        sys.stderr.flush()
sys.stderr.write("@@sent %d\n" % sent)
' 50000000 | ssh -F /dev/null -i /tmp/llmfleet-peer.abc/key -o IdentitiesOnly=yes -o BatchMode=yes -o UserKnownHostsFile=/tmp/llmfleet-peer.abc/known_hosts -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -o HostKeyAlias=llmfleet-peer -o ConnectTimeout=15 -o ServerAliveInterval=15 -o ServerAliveCountMax=4 -p 22 deploy@gpu-v100-02 llmfleet-receive
echo "@@ssh-rc $?"
