"""The shell programs the host runs in a sandbox over a channel of their own, to signal
what a session's command started (``SIGNAL_TREE``) or to kill a lost channel's agent and
all it started (``KILL_AGENT``).  POSIX sh (dash, busybox ash and bash); they read
``/proc`` only."""

from __future__ import annotations

# Run by the host over another channel: signal the processes a session's command started.
# $1 the session shell's pid, $2 the last pid made before the command started (from
# /proc/loadavg, per pid namespace: processes made before it, such as an earlier
# command's background jobs, are left alone),
# $3 the signal for them, $4 the signal for the shell itself ("" for none).
SIGNAL_TREE = r"""
__r=$1; __m=$2; __ts=$3; __ss=$4; __t=" $__r "; __sel=; __i=0
while [ $__i -lt 3 ]; do
  __i=$((__i + 1))
  for __f in /proc/[0-9]*/stat; do
    { read -r __l < "$__f"; } 2>/dev/null || continue
    __p=${__f#/proc/}; __p=${__p%/stat}
    case "$__t" in *" $__p "*) continue;; esac
    set -- ${__l##*) }
    [ "$1" = Z ] && continue
    case "$__t" in
      *" $2 "*) __t="$__t$__p "; [ "$__p" -gt "$__m" ] && __sel="$__sel $__p";;
    esac
  done
done
# bash, waiting for a foreground child when SIGINT reaches it, gives up the rest of the
# command only if that child dies of SIGINT too: one that dies otherwise is taken for a
# program that handled the interrupt itself, and the command's next line runs.  So the
# shell is signalled first, and a SIGKILL for the tree comes after a SIGINT: a process
# with SIGINT's default action is marked dying of SIGINT the moment it is sent one (the
# SIGKILL after it changes nothing), one that catches or ignores it dies of the SIGKILL.
# gVisor's kernel marks a process only when it takes the signal, so a SIGKILL sent at once
# would be the cause of death there: the SIGKILL waits until the tree is gone or zombies
# (builtins, at most 300 scans; at once on Linux, where they are)
[ -n "$__ss" ] && kill -"$__ss" "$__r" 2>/dev/null
if [ -n "$__sel" ] && [ "$__ts" = 9 ]; then
  kill -2 $__sel 2>/dev/null; __i=0
  while [ $__i -lt 300 ]; do
    __i=$((__i + 1)); __left=
    for __p in $__sel; do
      { read -r __l < "/proc/$__p/stat"; } 2>/dev/null || continue
      set -- ${__l##*) }; [ "$1" = Z ] || { __left=1; break; }
    done
    [ -z "$__left" ] && break
  done
fi
[ -n "$__sel" ] && kill -"$__ts" $__sel 2>/dev/null
echo "signalled:$__sel"
"""

# Run by the host through a fresh ``podman exec`` when a channel is lost: kill the agent
# ($1) and everything it started (by parent links and by session), nothing else.
KILL_AGENT = r"""
__t=" $1 "; __i=0
while [ $__i -lt 4 ]; do
  __i=$((__i + 1))
  for __f in /proc/[0-9]*/stat; do
    { read -r __l < "$__f"; } 2>/dev/null || continue
    __p=${__f#/proc/}; __p=${__p%/stat}
    case "$__t" in *" $__p "*) continue;; esac
    set -- ${__l##*) }
    case "$__t" in *" $2 "*|*" $4 "*) __t="$__t$__p ";; esac
  done
done
kill -9 $__t 2>/dev/null
"""
