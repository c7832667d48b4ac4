#!/bin/sh
# The installs of fleet-agent under INSTALL_DIR and which one runs. fleet-agent-install.sh puts each
# bundle in a venv of its own, INSTALL_DIR/versions/NAME; INSTALL_DIR/current, a symlink that the
# systemd unit's ExecStart goes through, names the one that runs, and INSTALL_DIR/previous the one
# before it, which an upgrade whose agent does not come up switches back to. A link is switched
# atomically (a new link renamed over the old one): at every moment it names a whole install.
# An install of the older layout (one venv in INSTALL_DIR itself, upgraded in place) is taken over
# as it is, current -> "." (its scripts name their interpreter by absolute path: it cannot move);
# the first upgrade installs beside it, and a later prune removes it.
# Usage:
#   fleet-agent-versions.sh switch INSTALL_DIR TARGET [UNIT_PATH]
#       Point current at TARGET (versions/NAME, or "." for an install of the older layout) and
#       previous at what current named; prints previous=WHAT and current=TARGET. With UNIT_PATH, a
#       unit written for the older layout (ExecStart=INSTALL_DIR/bin/fleet-agent ...) is made to go
#       through current, and systemd reloaded: prints unit=rewritten.
#   fleet-agent-versions.sh adopt INSTALL_DIR
#       Give an install of the older layout its current link; prints current=WHAT (or nothing).
#   fleet-agent-versions.sh discard INSTALL_DIR versions/NAME
#       Remove an install that is not current (one whose agent did not come up); prints removed=NAME.
#   fleet-agent-versions.sh prune INSTALL_DIR KEEP
#       Remove every install but current, previous and the newest others, KEEP in all (at least 1);
#       prints removed=NAME for each.
set -eu
ACTION=${1:-}
INSTALL_DIR=${2:-}
[ -n "$INSTALL_DIR" ] || { echo "usage: $0 switch|adopt|discard|prune INSTALL_DIR ..." >&2; exit 2; }
LEGACY_ENTRIES="bin include lib lib64 share pyvenv.cfg bundle.json bundle.json.tmp"

legacy() {
    [ -x "$INSTALL_DIR/bin/fleet-agent" ] && [ -r "$INSTALL_DIR/bundle.json" ]
}

free() {
    echo "$(df -Pk "$INSTALL_DIR" 2>/dev/null | awk 'NR == 2 { print int($4 / 1024) }') MiB and" \
        "$(df -Pi "$INSTALL_DIR" 2>/dev/null | awk 'NR == 2 { print $4 }') inodes free"
}

# link NAME TARGET: INSTALL_DIR/NAME -> TARGET, atomically; on a failure NAME is as it was.
link() {
    tmp="$INSTALL_DIR/.$1.new.$$"
    rm -f "$tmp"
    if ! out=$(ln -s "$2" "$tmp" 2>&1 && mv -fT "$tmp" "$INSTALL_DIR/$1" 2>&1); then
        rm -f "$tmp"
        if printf '%s\n' "$out" | grep -qi -e 'no space left' -e 'quota'; then
            echo "error: no space left on $INSTALL_DIR ($(free)) while pointing $1 at" \
                "$2; $1 is as it was" >&2
        else
            echo "error: pointing $INSTALL_DIR/$1 at $2 failed: $out" >&2
        fi
        exit 1
    fi
}

current_target() {
    target=$(readlink "$INSTALL_DIR/current" 2>/dev/null || true)
    if [ -z "$target" ] && legacy; then target=.; fi
    echo "$target"
}

case $ACTION in
switch)
    TARGET=${3:-}
    UNIT=${4:-}
    case $TARGET in
    .) legacy || { echo "error: no install of the older layout in $INSTALL_DIR" >&2; exit 2; } ;;
    versions/*/* | versions/.*) echo "error: $TARGET is not an install" >&2; exit 2 ;;
    versions/?*)
        [ -r "$INSTALL_DIR/$TARGET/bundle.json" ] && [ -x "$INSTALL_DIR/$TARGET/bin/fleet-agent" ] \
            || { echo "error: $INSTALL_DIR/$TARGET is no finished install" >&2; exit 2; } ;;
    *) echo "error: $TARGET is not versions/NAME or ." >&2; exit 2 ;;
    esac
    was=$(current_target)
    if [ "$was" != "$TARGET" ]; then
        if [ -n "$was" ]; then link previous "$was"; fi
        link current "$TARGET"
    fi
    echo "previous=$was"
    echo "current=$TARGET"
    if [ -n "$UNIT" ] && [ -f "$UNIT" ] && grep -qF "ExecStart=$INSTALL_DIR/bin/fleet-agent " "$UNIT"; then
        # The first upgrade of an install of the older layout: its unit must go through current.
        # The only line that differs from the unit the templates render now.
        awk -v old="ExecStart=$INSTALL_DIR/bin/fleet-agent " \
            -v new="ExecStart=$INSTALL_DIR/current/bin/fleet-agent " \
            'index($0, old) == 1 { $0 = new substr($0, length(old) + 1) } { print }' \
            "$UNIT" >"$UNIT.new.$$" && chmod 0644 "$UNIT.new.$$" && mv -f "$UNIT.new.$$" "$UNIT" \
            || { rm -f "$UNIT.new.$$"; echo "error: rewriting $UNIT failed" >&2; exit 1; }
        # The caller reloads systemd as well: a stand-in that cannot is no reason to stop here.
        if command -v systemctl >/dev/null 2>&1; then systemctl daemon-reload >/dev/null 2>&1 || true; fi
        echo "unit=rewritten"
    fi
    ;;
adopt)
    if [ ! -L "$INSTALL_DIR/current" ] && legacy; then
        link current .
    fi
    target=$(readlink "$INSTALL_DIR/current" 2>/dev/null || true)
    if [ -n "$target" ]; then echo "current=$target"; fi
    ;;
discard)
    NAME=${3:-}
    case $NAME in
    versions/*/* | versions/.*) echo "error: $NAME is not an install" >&2; exit 2 ;;
    versions/?*) ;;
    *) echo "error: $NAME is not versions/NAME" >&2; exit 2 ;;
    esac
    if [ "$(current_target)" = "$NAME" ]; then
        echo "error: $NAME is the install that current names: it stays" >&2
        exit 2
    fi
    if [ "$(readlink "$INSTALL_DIR/previous" 2>/dev/null || true)" = "$NAME" ]; then
        rm -f "$INSTALL_DIR/previous"
    fi
    if [ -e "$INSTALL_DIR/$NAME" ]; then
        rm -rf "${INSTALL_DIR:?}/$NAME"
        echo "removed=$NAME"
    fi
    ;;
prune)
    KEEP=${3:-2}
    case $KEEP in '' | *[!0-9]* | 0) echo "error: KEEP must be 1 or more" >&2; exit 2 ;; esac
    cur=$(current_target)
    prev=$(readlink "$INSTALL_DIR/previous" 2>/dev/null || true)
    # Newest first; the install of the older layout is older than any other.
    all=$(cd "$INSTALL_DIR" 2>/dev/null && ls -1t versions 2>/dev/null | sed 's|^|versions/|')
    if legacy; then all="$all
."; fi
    kept=""
    count=0
    for wanted in "$cur" "$prev" $all; do
        [ -n "$wanted" ] && [ "$count" -lt "$KEEP" ] || continue
        case " $kept " in *" $wanted "*) continue ;; esac
        # An install that did not finish (no bundle.json) is never worth keeping.
        if [ "$wanted" != "." ] && [ ! -r "$INSTALL_DIR/$wanted/bundle.json" ]; then continue; fi
        [ -e "$INSTALL_DIR/$wanted" ] || continue
        kept="$kept $wanted"
        count=$((count + 1))
    done
    for name in $all; do
        case " $kept " in *" $name "*) continue ;; esac
        if [ "$name" = "." ]; then
            for entry in $LEGACY_ENTRIES; do rm -rf "${INSTALL_DIR:?}/$entry"; done
        else
            rm -rf "${INSTALL_DIR:?}/$name"
        fi
        echo "removed=$name"
    done
    case " $kept " in *" $prev "*) ;; *) rm -f "$INSTALL_DIR/previous" ;; esac
    ;;
*)
    echo "usage: $0 switch|adopt|discard|prune INSTALL_DIR ..." >&2
    exit 2
    ;;
esac
