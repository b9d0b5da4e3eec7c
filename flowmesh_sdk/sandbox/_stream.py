"""The sandbox agent's streamed processes (``__fm_proc``, what ``Sandbox.start`` and
``exec(on_stdout=...)`` send; ``_agent.AGENT`` includes it, and process.py is the host's
side): the command's standard input is a fifo fed from the channel's ``__fm_in`` frames,
and its output is streamed as it is written, by the framer (``_framer.py``) where it can
watch the process, else by the shell's own looks (``wc``, ``dd``, ``sleep``)."""

from __future__ import annotations

__all__ = ["STREAM"]

STREAM = r"""
__fm_feed() {
  # the input side of a streamed process: frames from the host into its stdin fifo
  trap '' PIPE INT
  __open=1; { command exec 8>"$1"; } 2>/dev/null || __open=0
  while IFS=' ' read -r __k __n; do
    case "$__k" in
      __fm_in)
        case "$__n" in ''|*[!0-9]*) continue;; esac
        while [ "$__n" -gt 0 ]; do
          __k=$__n; [ "$__k" -gt 65536 ] && __k=65536
          if [ $__open = 1 ]; then
            command dd bs="$__k" count=1 iflag=fullblock 2>/dev/null >&8
          else
            command dd bs="$__k" count=1 iflag=fullblock 2>/dev/null >/dev/null
          fi
          __n=$((__n - __k))
        done;;
      __fm_eof) [ $__open = 1 ] && exec 8>&-; __open=0;;
      __fm_end) [ $__open = 1 ] && exec 8>&-; exit 0;;
    esac
  done
  exit 0
}
__fm_send() {
  # stream $1 (1 or 2) has $2 bytes in all; send what is new, up to the cap
  if [ "$1" = 1 ]; then __sent=$__so; else __sent=$__se; fi
  __n=$2; [ "$__n" -gt "$__cap" ] && __n=$__cap
  __n=$((__n - __sent))
  while [ "$__n" -gt 0 ]; do
    __k=$__n; [ "$__k" -gt 1048576 ] && __k=1048576
    printf '__FMP__ %s %s %s\n' "$__id" "$1" "$__k"
    if [ "$1" = 1 ]; then
      __fm_copy 5 "$__k"; __so=$((__so + __k))
    else
      __fm_copy 6 "$__k"; __se=$((__se + __k))
    fi
    __n=$((__n - __k)); __moved=1
  done
}
__fm_flush() {
  __fm_sizes
  __fm_send 1 "$__os"; __fm_send 2 "$__es"
}
__fm_poll() {
  # the shell's way to stream: look at the command's state and its files (wc, dd), and
  # wait with sleep between looks
  __nap=0.002
  while :; do
    __z=0; { read -r __l < /proc/$__c/stat; } 2>/dev/null || __z=1
    case "$__l" in *") Z "*) __z=1;; esac
    __moved=0; __fm_flush
    [ $__z = 1 ] && return 0
    if [ $__moved = 0 ]; then
      command sleep $__nap
      case $__nap in 0.002) __nap=0.005;; 0.005) __nap=0.01;; 0.01) __nap=0.02;; *) __nap=0.05;; esac
    else __nap=0.002; fi
  done
}
__fm_proc() {
  __fm_mk; __fm_names
  __fm_store
  if [ -z "$__bad" ]; then
    # the stock's fifo for this pair, else one made now
    if [ -n "$__pf" ] && [ -p "$__pf" ] && [ ! -h "$__pf" ]; then __f=$__pf
    else
      { { [ ! -e "$__f" ] && [ ! -h "$__f" ]; } || command rm -f -- "$__f"; command mkfifo "$__f"; } 2>/dev/null \
        || __bad="flowmesh: cannot make a fifo in $__fm_d"
    fi
  fi
  if [ -z "$__bad" ]; then
    { command exec 3>"$__o" 4>"$__e" 5<"$__o" 6<"$__e"; } 2>/dev/null \
      || __bad="flowmesh: cannot create output files in $__fm_d"
  fi
  if [ -n "$__bad" ]; then
    exec 3>&- 4>&- 5<&- 6<&-
    printf '__FMP__ %s 2 %s\n%s__FMP__ %s end 125 0 0 %s\n' "$__id" "${#__bad}" "$__bad" "$__id" "${#__bad}"
    ( __fm_feed /dev/null )
    printf '__FMP__ %s idle\n' "$__id"
    return
  fi
  exec 8<&0
  ( __fm_feed "$__f" ) 0<&8 3>&- 4>&- 5<&- 6<&- 7>&- 8<&- 9<&- &
  __r=$!
  exec 8<&-
  __fm_go "$__f"
  exec 3>&- 4>&-
  printf '__FMP__ %s pid %s\n' "$__id" "$__c"
  __wa=; __w=; [ "$__to" != 0 ] && __fm_arm
  # its output streamed by the framer (_framer.py) until it ends, else the shell's way
  # (its status and sizes in names of their own: __fm_disarm sets __x)
  __so=0; __se=0; __fs=4
  [ -x "$__fm_d/fr" ] && { __fz=$("$__fm_d/fr" "$__id" "$__cap" "$__c" 9<&-); __fs=$?; }
  case $__fs in
    0) __os=${__fz%% *}; __es=${__fz#* };;
    2|4|126|127) __fm_poll;;
  esac
  wait $__c; __rc=$?; __tw=0
  [ -n "$__wa$__w" ] && __fm_disarm
  case $__fs in 0) ;; 2|4|126|127) __fm_flush;; *) __fm_sizes;; esac
  printf '__FMP__ %s end %s %s %s %s\n' "$__id" "$__rc" "$__tw" "$__os" "$__es"
  exec 5<&- 6<&-
  # a reader still waiting for the fifo's other end is let through (and then sees EPIPE)
  { command exec 8<>"$__f"; } 2>/dev/null; exec 8<&-
  wait $__r
  printf '__FMP__ %s idle\n' "$__id"
  __fm_wcheck; __fm_stand
}
"""
