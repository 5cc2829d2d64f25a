# Sourced by the scripts: one timestamped line per phase, so a slow cold start explains
# itself ("[14:03:12 +95s] boot the test host"). SECONDS counts from the script's start.
phase() { printf '[%s +%ss] %s\n' "$(date -u +%H:%M:%S)" "$SECONDS" "$*" >&2; }
