#!/bin/sh
# Prints the last LINES (default 15) lines fleet-agent logged: from the journal under systemd,
# else from the log of the systemctl stand-in a host without systemd as PID 1 runs (docker-
# systemctl-replacement). Used to give the cause when an upgrade or a start fails; never fails.
# Usage: fleet-agent-log.sh [LINES]
lines=${1:-15}
case $lines in ''|*[!0-9]*) lines=15 ;; esac
if [ -d /run/systemd/system ] && command -v journalctl >/dev/null 2>&1; then
    journalctl -u fleet-agent.service -n "$lines" --no-pager -o cat 2>/dev/null
else
    systemctl log fleet-agent.service 2>/dev/null | tail -n "$lines"
fi
exit 0
