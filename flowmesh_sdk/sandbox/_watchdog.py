"""The timeout watchdogs of the sandbox agent (``_agent.AGENT``), in POSIX sh the agent
includes: at a command's deadline its whole tree is killed (``__fm_kill``).  With bash in
the image, one watcher per agent times every command (``_WATCHER``: no process per
command); without it, each command has a watcher of its own (``__fm_watch``).  The agent
calls ``__fm_arm`` once the command runs, ``__fm_disarm`` once it has reaped it, and
``__fm_wcheck`` after each answer."""

from __future__ import annotations

from ._common import sh_quote

__all__ = ["WATCHDOG"]

# Kills a command's tree at its timeout (run by a command's own watcher, or the agent's)
_KILL = r"""
__fm_kill() {
  # the command's group first (its shell and what it started die together), then by links.
  # Builtins only: a tree that fills the process limit leaves no fork.  It returns once
  # none of the tree is left, zombies too (the sandbox's PID 1 reaps them; a zombie holds
  # its slot under the limit until then, and the next command forks), or after 3000
  # rounds of the scan
  __t=" $1 "; __r=0; [ -n "$__fm_ss" ] && kill -9 -"$1" 2>/dev/null; kill -9 "$1" 2>/dev/null
  while [ $__r -lt 3000 ]; do
    __r=$((__r + 1)); __hit=0; __zz=0
    [ -n "$__fm_ss" ] && kill -9 -"$1" 2>/dev/null
    for __f in /proc/[0-9]*/stat; do
      { read -r __l < "$__f"; } 2>/dev/null || continue
      __p=${__f#/proc/}; __p=${__p%/stat}; __l=${__l##*) }
      set -- "$1" $__l
      if { [ -n "$__fm_ss" ] && [ "$5" = "$1" ]; } || case "$__t" in *" $3 "*) true;; *) false;; esac
      then
        # the command's own zombie is the agent's to reap
        [ "$2" = Z ] && { [ "$__p" = "$1" ] || __zz=1; continue; }
        kill -9 "$__p" 2>/dev/null; __t="$__t$__p "; __hit=1
      fi
    done
    [ $__hit = 0 ] && [ $__zz = 0 ] && [ $__r -gt 1 ] && break
  done
}
"""

# The agent's own watcher (``__fm_w``), under bash: ``bash -c PROGRAM bash SETSID AGENT_PID
# MARK``, its stdin the agent's watcher fifo, held open here for reading and writing.
# bash's ``read -t`` times a command with no process of its own, where a watcher per
# command (``__fm_watch``) costs a fork and a ``sleep`` for every command.  The agent
# writes ``go ID PID TIMEOUT`` once the command runs and ``end ID`` once it has reaped it
# (each message opens the fifo for reading and writing: a write never blocks nor raises
# SIGPIPE).  At the deadline it writes ID to MARK, then kills the command's tree.  A
# message other than the awaited ``end`` (one an earlier watcher left unread) is skipped.
# It ends once the agent is gone and no command is being timed; a command it is timing
# when the agent goes is still killed at its deadline, as a watcher per command would be.
# A bash older than 4.0 (no fractional timeouts) exits at once, and the agent falls back
# to a watcher per command
_WATCHER = r"""
[ "${BASH_VERSINFO[0]:-0}" -ge 4 ] 2>/dev/null || exit 1
__fm_ss=$1; __fm_ag=$2; __fm_mark=$3
""" + _KILL + r"""
while :; do
  if IFS=' ' read -r -t 5 __op __id __c __to; then
    [ "$__op" = go ] || continue
    # a timeout of 0.000 (under a millisecond) is over already; read -t 0 would not wait
    case "$__to" in *[1-9]*) ;; *) __to=0.001;; esac
    while :; do
      if IFS=' ' read -r -t "$__to" __op __x; then
        [ "$__op $__x" = "end $__id" ] && break
      elif [ $? -gt 128 ]; then
        { printf '%s\n' "$__id" > "$__fm_mark"; } 2>/dev/null
        __fm_kill "$__c"; break
      fi
    done
  elif [ $? -gt 128 ]; then
    kill -0 "$__fm_ag" 2>/dev/null || exit 0
  else exit 0
  fi
done
"""

# The agent's side: the watcher's program in __fm_wp, and the functions it calls
WATCHDOG = _KILL + "__fm_wp=" + sh_quote(_WATCHER) + r"""
__fm_wstart() {
  # the agent's watcher (_WATCHER), at most three times in the agent's life (a bash that
  # cannot serve ends at once: then each command has a watcher of its own; __fm_wf empty)
  __fm_w=
  [ "$__fm_wn" -lt 3 ] || { __fm_wf=; return 0; }
  __fm_wn=$((__fm_wn + 1))
  # The fifo is opened here and inherited at the fork: a message the agent writes before
  # the watcher has run is kept for it (a fifo no one holds open drops what it is sent).
  # Forked from a command substitution, so PID 1 reaps it: kill -0 tells its end at once
  # (a child of the agent's would stay a zombie, alive to kill -0, until the agent's next
  # wait), and the agent's $! stays the standby's
  [ -p "$__fm_wf" ] || { command mkdir -p -- "${__fm_wf%/*}"; command rm -f -- "$__fm_wf"
    command mkfifo -- "$__fm_wf"; } 2>/dev/null   # a command removed it
  [ -p "$__fm_wf" ] && { command exec 8<>"$__fm_wf"; } 2>/dev/null || return 0
  __fm_w=$( ( unset BASH_ENV ENV; exec bash -c "$__fm_wp" bash "$__fm_ss" "$$" "$__fm_wf.m" ) \
    <&8 >/dev/null 2>&1 3>&- 4>&- 5<&- 6<&- 7>&- 8<&- 9<&- & echo $! )
  exec 8<&-
}
__fm_tell() {
  # a line for the agent's watcher, through its fifo: never into a file made in its place
  # (the fifo is opened by name: a command may have removed it)
  [ -p "$__fm_wf" ] && { printf '%s\n' "$1" 1<>"$__fm_wf"; } 2>/dev/null
}
__fm_arm() {
  # the command's timeout: given to the agent's watcher while it runs, else to a watcher
  # of the command's own
  __w=; __wa=
  if [ -n "$__fm_w" ] && kill -0 "$__fm_w" 2>/dev/null && __fm_tell "go $__id $__c $__to"; then
    __wa=1
  else __fm_watch; fi
}
__fm_disarm() {
  # once the command is reaped ($__rc): __tw=1 when its timeout killed it.  A watcher
  # that cannot be told the command ended (its fifo removed) would still kill the
  # command's tree at the deadline: it is killed instead, and started again (__fm_wcheck)
  if [ -n "$__wa" ]; then
    __fm_tell "end $__id" || kill -9 "$__fm_w" 2>/dev/null; __tw=0
    # the watcher marks the command before it kills it: a command it killed ends by SIGKILL
    [ "$__rc" = 137 ] && { read -r __x < "$__fm_wf.m"; } 2>/dev/null && [ "$__x" = "$__id" ] && __tw=1
  else
    kill $__w 2>/dev/null; wait $__w; __tw=$?
    [ "$__tw" = 3 ] && __tw=1 || __tw=0
  fi
}
__fm_watch() {
  # A timeout watcher of the command's own, W: a subshell that forks the timer S (a
  # sleep), waits for it, then kills the command's tree and exits 3.  The agent cancels W
  # with a TERM once the command has ended; no S may outlive W, however the forks and the
  # signal interleave:
  # - TERM before W's trap is set: the default action ends W, which has forked no S yet;
  # - TERM after the trap is set: a shell runs a trap only between commands (the handler
  #   only notes the signal), and sets $! in W right after S's fork returns, so the trap
  #   sees either the value W inherited (kept in __wx before the trap is set: the agent's
  #   last background job, not signalled -- a streamed command's feed, or the command)
  #   or S's pid while S is W's unreaped child (its pid cannot be reused; only a TERM in
  #   the instant between the timer's end and `trap '' TERM` finds S just reaped);
  # - S is sent SIGKILL, not TERM: a TERM landing in S between the fork and S resetting
  #   the shell's inherited handler is taken by that handler and lost (S then sleeps on,
  #   orphaned: seen under load); SIGKILL cannot be caught, ignored or lost.
  ( __wx=$!; trap '[ "$!" = "$__wx" ] || kill -9 $! 2>/dev/null; exit 0' TERM
    sleep "$__to" & wait $!
    trap '' TERM; __fm_kill "$__c"; exit 3 ) 5<&- 6<&- 7>&- 9<&- &
  __w=$!
}
__fm_wcheck() {
  # the agent's watcher, started again if it is not running (a command killed it)
  [ -n "$__fm_wf" ] && { [ -z "$__fm_w" ] || ! kill -0 "$__fm_w" 2>/dev/null; } && __fm_wstart
  return 0
}
"""
