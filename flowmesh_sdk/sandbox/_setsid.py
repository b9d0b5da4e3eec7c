"""A session-leader launcher the agent writes into an x86-64 sandbox: ``ss PROGRAM ARG...``
calls ``setsid()`` and executes PROGRAM (an absolute path) with the given arguments and
its own environment, as util-linux's ``setsid`` does for a caller that leads no process
group, the case of every shell the agent starts.

Why: the shell an exec runs in is made ahead (the agent's standby), and on a sandbox's
CPU most of its cost was ``setsid``'s own exec, a dynamically linked program (about
0.7 ms here: the loader and libc). This program is 230 bytes with no loader and no libc:
a static ELF whose code is 13 instructions (about 0.07 ms here).

It exits 126 without executing anything when ``setsid()`` fails (the caller leads a
group: a fresh shell would not lead a session of its own), and 127 when the execve
fails; the agent checks it once (``__fm_ssprep``) before it uses it.

The machine code, as GNU ``as`` (Intel syntax) assembles it::

    b8 70 00 00 00     mov    eax, 112           ; setsid()
    0f 05              syscall
    85 c0              test   eax, eax
    78 1f              js     fail               ; below 0: an errno
    48 8b 04 24        mov    rax, [rsp]         ; argc
    48 8d 74 24 10     lea    rsi, [rsp+16]      ; argv + 1
    48 8b 3e           mov    rdi, [rsi]         ; argv[1]: the program
    48 8d 54 c4 10     lea    rdx, [rsp+rax*8+16]; envp: past argv's NULL
    b8 3b 00 00 00     mov    eax, 59            ; execve(argv[1], argv + 1, envp)
    0f 05              syscall
    bf 7f 00 00 00     mov    edi, 127           ; it returned: failed
    eb 05              jmp    out
  fail:
    bf 7e 00 00 00     mov    edi, 126
  out:
    b8 e7 00 00 00     mov    eax, 231           ; exit_group(edi)
    0f 05              syscall

Only x86-64: the agent uses it where ``/proc/cpuinfo`` names an x86 vendor (the kernel's
architecture, whatever the image's), and ``setsid`` everywhere else.
"""

from __future__ import annotations

import struct

__all__ = ["LAUNCHER", "SETSID_X86_64", "printf_format", "static_elf"]

_CODE = bytes.fromhex(
    "b870000000" "0f05" "85c0" "781f"
    "488b0424" "488d742410" "488b3e" "488d54c410"
    "b83b000000" "0f05" "bf7f000000" "eb05"
    "bf7e000000"
    "b8e7000000" "0f05")

_BASE = 0x400000          # where the one segment is mapped
_EHDR, _PHDR = 64, 56     # the ELF64 header, a program header


def static_elf(code: bytes, machine: int) -> bytes:
    """A static ELF64 executable of ``code`` (position-dependent, entered at its first byte):
    one segment, read and execute, and a stack nothing may be executed on."""
    size = _EHDR + 2 * _PHDR + len(code)
    ehdr = struct.pack("<4sBBBBB7xHHIQQQIHHHHHH",
                       b"\x7fELF", 2, 1, 1, 0, 0,          # 64-bit, little-endian, version 1, SysV
                       2, machine, 1,                        # ET_EXEC, the machine, version 1
                       _BASE + size - len(code), _EHDR, 0,   # entry, program headers, no sections
                       0, _EHDR, _PHDR, 2, 0, 0, 0)
    # PT_LOAD: the whole file at _BASE, read and execute; PT_GNU_STACK: a stack that is
    # read and write only (without it the kernel would make it executable)
    load = struct.pack("<IIQQQQQQ", 1, 5, 0, _BASE, _BASE, size, size, 0x1000)
    stack = struct.pack("<IIQQQQQQ", 0x6474E551, 6, 0, 0, 0, 0, 0, 16)
    return ehdr + load + stack + code


SETSID_X86_64 = static_elf(_CODE, 62)   # EM_X86_64


def printf_format(data: bytes) -> str:
    """``data`` as a printf format of octal escapes (dash, busybox ash and bash print it
    byte for byte, NULs included)."""
    return "".join(f"\\{b:03o}" for b in data)


# The agent's side (``_agent.AGENT`` includes it): the launcher's bytes in __fm_ssb, and
# the functions that check it once and use it
LAUNCHER = "__fm_ssb='" + printf_format(SETSID_X86_64) + "'\n" + r"""
__fm_sx() {
  # exec "$@" (an absolute path first) as the leader of a session of its own: through the
  # agent's launcher once __fm_ssprep has checked it (_setsid.py), else through setsid
  [ -n "$__fm_ss" ] && [ -x "$__fm_d/ss" ] && exec "$__fm_d/ss" "$@"
  exec $__fm_ss "$@"
}
__fm_ssprep() {
  # The launcher, written from __fm_ssb to $__fm_d/ss, in the first kick's background job:
  # on an x86 kernel (an x86 vendor in /proc/cpuinfo) and with setsid to fall back on,
  # once a shell it started has shown that it leads its own session (a directory where
  # nothing may be executed, or no chmod, leaves setsid in use)
  [ -n "$__fm_ss" ] && __fm_x86 || return 0
  __x="$__fm_d/ss.new"
  { { printf "$__fm_ssb" > "$__x" && command chmod 700 "$__x" \
      && "$__x" /bin/sh -c 'read -r p c t pp g s r </proc/$$/stat && [ "$s" = $$ ]' \
      && command mv -f "$__x" "$__fm_d/ss"; } || command rm -f -- "$__x"; } >/dev/null 2>&1
}
"""
