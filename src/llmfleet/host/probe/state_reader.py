"""The release-state reader: a POSIX shell function that prints every service's current release, unit
state and kept releases (manifest, health) under a root. Light on purpose (no imports of the release
machinery): the host probe (``llmfleet.host.probe``, this package) sends it as a section of its document, and
``llmfleet.release.store`` runs it on its own (``state_script``) and parses what it prints.
"""

from __future__ import annotations

MANIFEST_FILE = "manifest.json"  # each release's manifest (llmfleet.release.render writes it)
MAX_MANIFEST = 65536  # bytes of one manifest.json the state reader returns
MAX_HEALTH = 16384  # bytes of one health.json

# Names that are not a service or release id are skipped on the host.
STATE_READER = f"""llmfleet_release_state() {{
  base="$1/services"
  if [ -d "$base" ]; then
    for s in "$base"/*/; do
      [ -d "$s" ] || continue
      name=$(basename "$s")
      case "$name" in *[!A-Za-z0-9_-]*|"") continue ;; esac
      echo "@@service $name"
      echo "@@current $(readlink "$s/current" 2>/dev/null | tr -d '\\n')"
      echo "@@unit $(systemctl is-active "llmfleet-$name.service" 2>/dev/null)"
      for d in "$s"releases/*/; do
        [ -d "$d" ] || continue
        rid=$(basename "$d")
        case "$rid" in *[!0-9A-Za-z-]*|"") continue ;; esac
        echo "@@release $rid"
        if [ -f "$d/{MANIFEST_FILE}" ]; then echo "@@manifest $(head -c {MAX_MANIFEST} "$d/{MANIFEST_FILE}" | tr -d '\\n')"; fi
        if [ -f "$d/health.json" ]; then echo "@@health $(head -c {MAX_HEALTH} "$d/health.json" | tr -d '\\n')"; fi
      done
    done
  fi
  echo '@@end'
}}"""
