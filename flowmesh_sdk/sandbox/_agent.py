"""The shell programs that run inside a sandbox (POSIX sh: dash, busybox ash and bash).

``AGENT`` serves one held-open channel: buffered commands (``__fm_run``, what ``exec``
and the file calls send) and streamed processes (``__fm_proc``, what ``start`` and
``exec(on_stdout=...)`` send: ``_stream.py``).  ``SESSION`` turns an interactive shell
into a session whose state persists between commands.  ``SIGNAL_TREE`` and ``KILL_AGENT``
are run by the host to signal a session's command or to clean up after a lost channel
(they are in ``_host_scripts.py``, re-exported here).  A command's timeout is
``_watchdog.py``'s.  See the package docstring for the framing.
"""

from __future__ import annotations

from ._common import sh_quote
from ._framer import FRAMER
from ._host_scripts import KILL_AGENT, SIGNAL_TREE
from ._setsid import LAUNCHER
from ._stream import STREAM
from ._watchdog import WATCHDOG

__all__ = ["AGENT", "KILL_AGENT", "SESSION", "SIGNAL_TREE"]   # the last two live in _host_scripts.py

# ---- shared pieces ---------------------------------------------------------------------
_COMMON = r"""
__fm_ss=; __fm_q=; __fm_b=0; __fm_j=0; __fm_n=0; __fm_k=0; __fm_f=0; __fm_old=; __fm_prev=
command -v setsid >/dev/null 2>&1 && __fm_ss=setsid
# Slots kept for the SDK's own processes.  Under a process limit (pids.max) the commands
# may fill, the agent -- which must fork to answer, and which ends when it cannot (a
# non-interactive shell that cannot fork exits) -- keeps 8: what an exec or a started
# process runs gets RLIMIT_NPROC = pids.max - 8 (soft and hard: it
# cannot be raised again without CAP_SYS_RESOURCE), a limit on all the processes of its
# user, checked at each fork.  Only in a user namespace of the sandbox's own: there
# the count is the sandbox's; with the host's uid 0 it would count the host's processes.
# Not a session's shell: it forks to answer too, and the limit is per process.  Under
# gVisor the host sets __fm_gv to the sandbox's process limit: gVisor's kernel counts
# RLIMIT_NPROC over the sandbox only, root's processes too (the host's pids.max counts
# gVisor's own threads there, not the sandbox's processes)
__fm_np=
if [ -n "${__fm_gv:-}" ]; then
  [ "$__fm_gv" -gt 16 ] && __fm_np=$((__fm_gv - 8))
elif { read -r __x __y __z < /proc/self/uid_map; } 2>/dev/null && [ "$__x $__y $__z" != "0 0 4294967295" ]; then
  for __f in /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max; do
    { read -r __x < "$__f"; } 2>/dev/null || continue
    case "$__x" in ''|*[!0-9]*) ;; *) [ "$__x" -gt 16 ] && __fm_np=$((__x - 8));; esac
    break
  done
fi
__fm_x86() {
  # an x86 kernel (the first CPU's vendor_id), whatever the image's architecture: where the
  # agent's static programs run (_setsid.py, _framer.py)
  { read -r __x && read -r __x; } </proc/cpuinfo 2>/dev/null || return 1
  case "$__x" in vendor_id*) return 0;; esac
  return 1
}
__fm_nproc() {
  [ -n "$__fm_np" ] && { ulimit -u "$__fm_np" || ulimit -p "$__fm_np"; } 2>/dev/null
  return 0
}
__fm_mk() {
  [ -d "$__fm_d" ] && [ -w "$__fm_d" ] && return 0
  for __fm_d in "$__fm_d0" "/tmp/.flowmesh-$__fm_tag$$" "/dev/shm/.flowmesh-$__fm_tag$$" "/.flowmesh-$__fm_tag$$"; do
    command mkdir -p "$__fm_d" 2>/dev/null && [ -w "$__fm_d" ] && return 0
  done; return 1
}
__fm_mkq() {
  # short scripts go to a tmpfs when there is one (/dev/shm): making a file there costs a
  # fraction of making one on the container's overlay
  [ -d "$__fm_q" ] && [ -w "$__fm_q" ] && return 0
  __fm_q="/dev/shm/.flowmesh-$__fm_tag$$"
  command mkdir -p "$__fm_q" 2>/dev/null && [ -w "$__fm_q" ] && return 0
  __fm_q=$__fm_d
}
__fm_unheld() {
  # true when no process has a file under the directory $1 open, as /proc shows them: one
  # whose descriptors may not be listed counts as having one (a process gone meanwhile
  # has none), and so does everything when ls cannot run.  A no is asked again once: a
  # process that is ending as the list is made may refuse to be listed
  __fm_scan "$1" || __fm_scan "$1"
}
__fm_scan() {
  { LC_ALL=C command ls -ln /proc/[0-9]*/fd/ 2>&1 || [ $? -lt 3 ] || echo "$1/"; } \
    | command grep -qF -e "$1/" -e denied
  [ $? = 1 ]
}
__fm_size() {
  # __n: how many output pairs stock $1 holds.  Stocks grow (2, 4, 8, 16, then 32 each),
  # so a sandbox that runs a few commands makes a few files, not two stocks of 32
  __n=32; [ "$1" -lt 5 ] && __n=$((1 << $1)); return 0
}
__fm_empty() {
  # the used stock $1 made ready for $2 output pairs: its files emptied, those it lacks
  # made (stocks grow), and their fifos (__fm_fifos); false if one is not a plain file, or
  # a fifo not a fifo (then it is not used again)
  __x=0; __sd=$1; __sc=$2; set --
  while [ $__x -lt $__sc ]; do
    for __y in "$__sd/$__x.o" "$__sd/$__x.e"; do
      { [ ! -h "$__y" ] && { [ -f "$__y" ] || [ ! -e "$__y" ]; } && : > "$__y"; } || return 1
    done
    __y="$__sd/$__x.f"
    if [ -h "$__y" ] || { [ -e "$__y" ] && [ ! -p "$__y" ]; }; then return 1; fi
    [ -p "$__y" ] || set -- "$@" "$__y"
    __x=$((__x + 1))
  done
  __fm_fifos "$@"
}
__fm_fifos() {
  # the fifos "$@", one per output pair of a stock, made with it: a streamed process's
  # standard input (__fm_proc), so that it makes none as it starts.  The agent's only (a
  # session streams nothing), where mkfifo works (the agent's control fifo was made)
  [ -n "$__fm_cf" ] && [ $# -gt 0 ] && command mkfifo "$@"
  return 0
}
__fm_kick() {
  # in the background: remove the files of the commands done since the last kick, and
  # make the next stock of output pairs (__fm_size).  That is the stock before the one in
  # use, emptied, when no process holds any of its files (making a file on a container's
  # overlay costs far more than emptying one), else a fresh one (the old one removed: a
  # background job of an earlier command may still write to its file, and it must not
  # reach a later command's).  Forked from a subshell, so a session's $!, jobs and wait
  # never see it.
  __fm_k=$((__fm_b + 1)); __fm_size "$__fm_k"
  ( ( [ "$__fm_k" = 1 ] && { __fm_ssprep; __fm_frprep; }
    set --
    for __x in $__fm_old; do
      set -- "$@" "$__fm_d/$__x.sh" "$__fm_d/$__x.in" "$__fm_d/$__x.out" "$__fm_d/$__x.err" \
        "$__fm_d/$__x.fifo" "$__fm_q/$__x.sh"
    done
    __u="$__fm_d/s$((__fm_b - 1))"
    if [ -d "$__u" ] && __fm_unheld "$__u" && __fm_empty "$__u" "$__n"; then
      command mv "$__u" "$__fm_d/s$__fm_k"; command rm -rf -- "$@"; exit 0
    fi
    command rm -rf -- "$@" "$__u"
    __t="$__fm_d/t$__fm_k"; command mkdir "$__t" || exit 0
    __x=0; set --
    while [ $__x -lt $__n ]; do
      : > "$__t/$__x.o" && : > "$__t/$__x.e" || exit 0
      set -- "$@" "$__t/$__x.f"; __x=$((__x + 1))
    done
    __fm_fifos "$@"
    command mv "$__t" "$__fm_d/s$__fm_k" ) </dev/null >/dev/null 2>&1 3>&- 4>&- 5<&- 6<&- 7>&- 9<&- & )
  __fm_old=
}
__fm_names() {
  # this command's files.  Its output pair is the next of a stock made ahead in the
  # background (making a file on a container's overlay costs several times opening one),
  # or a fresh pair while there is none.  The previous command's files go at the next kick.
  __fm_old="$__fm_old $__fm_prev"; __fm_prev=$__id
  __s="$__fm_d/$__id.sh"; __i="$__fm_d/$__id.in"; __f="$__fm_d/$__id.fifo"
  if [ $__fm_j -ge $__fm_n ] || [ ! -d "$__fm_d/s$__fm_b" ]; then
    if [ -d "$__fm_d/s$((__fm_b + 1))" ]; then
      __fm_b=$((__fm_b + 1)); __fm_j=0; __fm_f=0; __fm_size "$__fm_b"; __fm_n=$__n; __fm_kick
    else
      __fm_f=$((__fm_f + 1))
      if [ $__fm_k -le $__fm_b ] || [ $__fm_f -ge 32 ]; then __fm_f=0; __fm_kick; fi
      __o="$__fm_d/$__id.out"; __e="$__fm_d/$__id.err"; __pf=
      return
    fi
  fi
  __o="$__fm_d/s$__fm_b/$__fm_j.o"; __e="$__fm_d/s$__fm_b/$__fm_j.e"; __pf="$__fm_d/s$__fm_b/$__fm_j.f"
  __fm_j=$((__fm_j + 1))
}
__fm_get() {
  __n=$1; __ok=0
  { command exec 8>"$2"; } 2>/dev/null || __ok=1
  while [ "$__n" -gt 0 ]; do
    __k=$__n; [ "$__k" -gt 1048576 ] && __k=1048576
    if [ $__ok = 0 ]; then
      command dd bs="$__k" count=1 iflag=fullblock 2>/dev/null >&8 || __ok=1
    else
      command dd bs="$__k" count=1 iflag=fullblock 2>/dev/null >/dev/null
    fi
    __n=$((__n - __k))
  done
  exec 8>&-
  return $__ok
}
__fm_lines() {
  # $1 lines of script into the file $__s, else (the tmpfs full) the same name in $__fm_d
  __n=$1; __src=
  while [ "$__n" -gt 0 ]; do
    IFS= read -r __l
    __src="$__src$__l
"
    __n=$((__n - 1))
  done
  { printf '%s' "$__src" > "$__s"; } 2>/dev/null && return 0
  __s="$__fm_d/${__s##*/}"
  { printf '%s' "$__src" > "$__s"; } 2>/dev/null
}
__fm_copy() {
  # exactly $2 bytes (at most 1 MiB) from the file open on fd $1 to the channel (fd 7), in
  # one dd: a short read (the file shrank under us) is padded with NULs to the block
  # (conv=sync), and a read of nothing is made up here, so a command can never shift
  # the framing.  dd's record counts say which (busybox prints no byte count)
  if [ "$1" = 5 ]; then
    __yr=$(LC_ALL=C command dd bs="$2" count=1 iflag=fullblock conv=sync <&5 2>&1 >&7)
  else
    __yr=$(LC_ALL=C command dd bs="$2" count=1 iflag=fullblock conv=sync <&6 2>&1 >&7)
  fi
  case "$__yr" in
    *"1+0 records out"*|*"0+1 records out"*) ;;
    *) command head -c "$2" /dev/zero >&7;;
  esac
  return 0
}
__fm_put() {
  # exactly $2 bytes of the file open on fd $1, in 1 MiB blocks
  __m=$2
  while [ "$__m" -gt 0 ]; do
    __k=$__m; [ "$__k" -gt 1048576 ] && __k=1048576
    __fm_copy "$1" "$__k"
    __m=$((__m - __k))
  done
}
__fm_sizes() {
  # the sizes of the output files held on fds 5 and 6 (no fork when both are empty)
  if [ -s /proc/self/fd/5 ] || [ -s /proc/self/fd/6 ]; then
    set -- $(command wc -c /proc/self/fd/5 /proc/self/fd/6 2>/dev/null)
    __os=${1:-0}; __es=${3:-0}
  else __os=0; __es=0; fi
}
__fm_store() {
  __bad=
  if [ "$__sn" -gt 0 ]; then __fm_mkq; __s="$__fm_q/${__s##*/}"; __fm_lines "$__sn"
  else __fm_get "$__sl" "$__s"; fi \
    || __bad="flowmesh: cannot store the command in $__fm_d (disk full or not writable)"
}
"""

# The standby's program (``sh -c PROGRAM sh``: see ``__fm_stand``)
_STANDBY = r"""
while :; do
  IFS= read -r __fm_p && IFS= read -r __fm_s && IFS= read -r __fm_i || exit 0
  [ "$__fm_p" = "$$" ] && break
done <"/proc/$PPID/fd/9"
exec <"$__fm_i" >>"/proc/$PPID/fd/5" 2>>"/proc/$PPID/fd/6"
unset __fm_p __fm_i
set --
case "$__fm_s" in
  *\'*) . "$__fm_s";;
  *) __fm_x="unset __fm_x; . '$__fm_s'"; unset __fm_s; eval "$__fm_x";;
esac
"""

AGENT = r"""
__fm_tag=; __fm_d0="${TMPDIR:-/tmp}/.flowmesh-$$"; __fm_d="$__fm_d0"
command rm -rf -- "$__fm_d0" 2>/dev/null
""" + _COMMON + FRAMER + WATCHDOG + LAUNCHER + STREAM + r"""
__fm_fail() {
  printf '__FM__ %s %s 0 0 %s
%s' "$__id" 125 "${#1}" "$1"
}
__fm_one() {
  __fm_mk; __fm_names
  __fm_store
  if [ "$__il" -gt 0 ]; then
    __fm_get "$__il" "$__i" || __bad="flowmesh: cannot store the input in $__fm_d (disk full or not writable)"
  else __i=/dev/null; fi
  if [ -z "$__bad" ]; then
    { command exec 3>"$__o" 4>"$__e" 5<"$__o" 6<"$__e"; } 2>/dev/null \
      || __bad="flowmesh: cannot create output files in $__fm_d"
  fi
  if [ -n "$__bad" ]; then
    exec 3>&- 4>&- 5<&- 6<&-; __fm_fail "$__bad"; command rm -f -- "$__fm_d"/* 2>/dev/null; return
  fi
  __fm_go "$__i"
  exec 3>&- 4>&-
  __fm_arm
  wait $__c; __rc=$?
  __fm_disarm
  __fm_answer "__FM__ $__id $__rc $__tw"
  exec 5<&- 6<&-
  __fm_wcheck; __fm_stand
}
__fm_go() {
  # the command's shell, its stdin $1 (__c: its pid): the standby made ahead takes it (its
  # pid, the script's and the input's names through the control fifo), else one forked now
  if [ -n "$__sb" ] && kill -0 "$__sb" 2>/dev/null; then
    printf '%s\n%s\n%s\n' "$__sb" "$__s" "$1" >&9
    __c=$__sb
  else
    ( __fm_nproc; __fm_sx /bin/sh "$__s" ) <"$1" >&3 2>&4 3>&- 4>&- 5<&- 6<&- 7>&- 9<&- &
    __c=$!
    [ -n "$__sb" ] && { kill -9 "$__sb"; wait "$__sb"; } 2>/dev/null
  fi
  __sb=
}
__fm_stand() {
  # The next command's fresh shell, made ahead while the host reads this answer: forked
  # and exec'd (setsid, /bin/sh: most of an exec's cost) before the command arrives.  It
  # waits on the control fifo (fd 9, which the agent holds open for reading and writing,
  # so a message waits there for its reader and the standby sees EOF once the agent is
  # gone; opened through /proc, so a command that removes its name changes nothing) for a
  # message that starts with its own pid: a message left by a standby that
  # died unread is skipped by the next.  Then it opens the command's output files through
  # the agent's own descriptors of them (fds 5 and 6, by /proc: the files the agent reads,
  # whatever a job of an earlier command did to their names) and runs the script in itself,
  # with none of its own variables left (the one holding the script's name goes in the eval
  # that reads the script, unless the name has a quote).  Without the
  # fifo (no mkfifo in the image) every command is forked as it arrives.
  [ -n "$__fm_cf" ] || return 0
  ( __fm_nproc; __fm_sx /bin/sh -c "$__fm_sbp" sh ) </dev/null >/dev/null 2>&1 \
    3>&- 4>&- 5<&- 6<&- 7>&- 9<&- &
  __sb=$!
}
""" + "__fm_sbp=" + sh_quote(_STANDBY) + "\n" + r"""
__fm_loop() {
  __fm_mk; __fm_mkq; __sb=; __fm_cf="$__fm_q/c"; __fm_wf=; __fm_wn=0
  command -v bash >/dev/null 2>&1 && __fm_wf="$__fm_q/w"
  # one mkfifo for both fifos: the control fifo and the watcher's
  { command mkfifo "$__fm_cf" ${__fm_wf:+"$__fm_wf"} && exec 9<>"$__fm_cf"; } 2>/dev/null \
    || { __fm_cf=; __fm_wf=; }
  exec 7>&1          # the channel, where __fm_copy writes (the commands never hold it)
  __fm_wstart; __fm_stand
  echo __FM_READY__ $$
  while IFS=' ' read -r __k __id __to __cap __sl __il __sn; do
    case "$__k $__id $__cap $__sl $__il $__sn" in
      "__fm_run "*[!0-9\ ]*|"__fm_proc "*[!0-9\ ]*) continue;;
      "__fm_run "*) __fm_one;;
      "__fm_proc "*) __fm_proc;;
    esac
  done
  [ -n "$__sb" ] && kill -9 "$__sb" 2>/dev/null
}
__fm_loop
"""

# The session program runs in an interactive shell (so that SIGINT aborts a running
# command, builtin loops included, and the shell returns to reading its input), whose
# own stdout and stderr are /dev/null: the framing goes to fd 7, the channel.
# ``__fm_sloop`` is sent after every command: the loop reads it as a no-op, and a shell
# thrown back to its top level (SIGINT, a syntax error) reads it as the call that
# answers the aborted command and re-enters the loop.
SESSION = r"""
__fm_tag=s; __fm_d0="${TMPDIR:-/tmp}/.flowmesh-s$$"; __fm_d="$__fm_d0"; __fm_cur=
command rm -rf -- "$__fm_d0" 2>/dev/null
[ -n "$BASH_VERSION" ] && { set +o history; unset HISTFILE; }
""" + _COMMON + FRAMER + r"""
__fm_foot() {
  # $1 the command's status; $2 2 when the shell is exiting (the host then drops it)
  __fm_r=$1
  trap '' INT
  exec 3>&- 4>&-
  __fm_answer "__FM__ $__fm_cur $__fm_r ${2:-0}" >&7
  exec 5<&- 6<&-
  __fm_cur=
}
__fm_srun() {
  __fm_mk; __fm_names
  __fm_store
  if [ -z "$__bad" ]; then
    { command exec 3>"$__o" 4>"$__e" 5<"$__o" 6<"$__e"; } 2>/dev/null \
      || __bad="flowmesh: cannot create output files in $__fm_d"
  fi
  if [ -n "$__bad" ]; then
    exec 3>&- 4>&- 5<&- 6<&-
    printf '__FMS__ %s 0\n__FM__ %s 125 0 0 %s\n%s' "$__id" "$__id" "${#__bad}" "$__bad" >&7
    return
  fi
  __lp=0; { read -r __x __x __x __x __lp < /proc/loadavg; } 2>/dev/null
  __fm_cur=$__id
  trap - INT
  # announced only once SIGINT would stop it (the host signals nothing before this line)
  printf '__FMS__ %s %s\n' "$__id" "${__lp:-0}" >&7
  { . "$__s"; } </dev/null >&3 2>&4 3>&- 4>&- 5<&- 6<&- 7>&-
  __fm_foot $?
}
__fm_sloop() {
  __fm_r=$?
  trap '' INT
  [ -n "$__fm_cur" ] && __fm_foot "$__fm_r"
  while IFS=' ' read -r __k __id __cap __sl __sn; do
    case "$__k $__id $__cap $__sl $__sn" in
      "__fm_srun "*[!0-9\ ]*) continue;;
      "__fm_srun "*) __fm_srun;;
    esac
  done
  exit 0
}
__fm_chan() {
  # the channel again, on fd 7: bash runs the EXIT trap inside the command's redirections
  # (fd 7 closed there; its saved copy is on an fd of bash's choosing), found by identity
  [ -n "$__fm_cl" ] || return 1
  for __f in /proc/$$/fd/*; do
    [ "$(command readlink "$__f" 2>/dev/null)" = "$__fm_cl" ] || continue
    eval "exec 7>&${__f##*/}" 2>/dev/null && return 0
  done
  return 1
}
__fm_exit() {
  # the EXIT trap: `exit` (or errexit) in a command ends the shell.  That command is
  # answered first, with the status the trap was given (read before anything else runs)
  # and flag 2, so the host starts a fresh shell for the next one.  dash and busybox ash
  # undo the command's redirections before the trap; bash does not: its streams, the
  # output files and the channel are set up again here
  __fm_r=$1
  [ -n "$__fm_cur" ] || return 0
  trap '' INT
  exec </dev/null >/dev/null 2>&1
  { : >&7; } 2>/dev/null || __fm_chan || return 0
  { exec 5<"$__o" 6<"$__e"; } 2>/dev/null
  __fm_foot "$__fm_r" 2
}
trap '__fm_exit $?' EXIT
__fm_cl=$(command readlink /proc/$$/fd/7 2>/dev/null)
__fm_mk
echo __FM_SREADY__ $$ >&7
__fm_sloop
"""
