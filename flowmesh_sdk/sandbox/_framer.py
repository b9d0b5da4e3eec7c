"""The answer framer the agent writes into an x86-64 sandbox: ``fr HEAD CAP`` writes, to its
standard output (the channel), ``HEAD``, the sizes of the files open on fds 5 and 6 (a
command's stdout and stderr), a newline, then at most ``CAP`` bytes of each: the answer
``__FM__ ID RC FLAG OUTBYTES ERRBYTES`` and its bytes (flowmesh_sdk/sandbox/__init__.py).

Why: without it, a command with output was answered by ``wc -c`` (the sizes) and one ``dd``
per stream (the bytes), dynamically linked programs the agent forks and executes per
command: ``exec("echo hi")`` cost 3.2 ms where ``exec("true")``, which has no output and
forks nothing to answer, cost 1.4 ms (a session command 2.3 ms against 0.5).  This program
is a static ELF with no loader and no libc (422 bytes of code): one fork and exec per
answer, of a program that makes four kinds of system call (fstat, read, write, exit).

It keeps ``dd``'s framing exactly: the sizes are each file's at the moment it looks
(fstat), the bytes are read from the descriptor's offset, and a file that is shorter than
its size said (a background job truncated it meanwhile) is padded with NULs, so a command
can never shift the framing.  It exits 0 once all is written, 2 without writing anything
when it is given no arguments, and 3 when a write fails (the channel is gone).  The agent
checks it once (``__fm_frprep``) before it uses it, and answers as before where it is
absent (``__fm_answer``).

Its source, as GNU ``as`` assembles it (``as fr.s && objcopy -O binary -j .text``: the
bytes below; tests/test_setsid_launcher.py assembles it again where ``as`` is installed)::

    .intel_syntax noprefix
    _start:                          # [rsp]: argc, argv[0], argv[1] = HEAD, argv[2] = CAP
        mov rbp, rsp
        sub rsp, 65792               # r14: a 64 KiB buffer, then fstat's 144 bytes, then
        mov r14, rsp                 #      20 bytes for a number's digits
        cmp qword ptr [rbp], 3       # fewer than two arguments: exit 2
        jb bad
        mov rsi, [rbp+24]
        xor r15d, r15d               # r15: CAP, its decimal digits up to the first non-digit
    1:  movzx eax, byte ptr [rsi]
        sub eax, 48
        cmp eax, 9
        ja 2f
        imul r15, r15, 10
        add r15, rax
        inc rsi
        jmp 1b
    2:  mov edi, 5                   # r12, r13: the sizes of fds 5 and 6
        call size
        mov r12, rax
        mov edi, 6
        call size
        mov r13, rax
        mov rdi, r14                 # the header in the buffer: HEAD (at most 4096 bytes),
        mov rsi, [rbp+16]            # " ", r12, " ", r13, "\n"
        mov ecx, 4096
    3:  mov al, [rsi]
        test al, al
        jz 4f
        mov [rdi], al
        inc rsi
        inc rdi
        dec ecx
        jnz 3b
    4:  mov byte ptr [rdi], 32
        inc rdi
        mov rax, r12
        call num
        mov byte ptr [rdi], 32
        inc rdi
        mov rax, r13
        call num
        mov byte ptr [rdi], 10
        inc rdi
        mov rdx, rdi
        sub rdx, r14
        mov rsi, r14
        call put
        mov r8d, 5                   # then the bytes of fd 5, and of fd 6
        mov rbx, r12
        call copy
        mov r8d, 6
        mov rbx, r13
        call copy
        xor edi, edi
        jmp out
    bad:
        mov edi, 2
    out:
        mov eax, 231                 # exit_group(edi)
        syscall
    size:                            # edi: a descriptor -> rax: its size (0 if fstat fails)
        lea rsi, [r14+65536]
        mov eax, 5                   # fstat
        syscall
        test rax, rax
        jnz 1f
        mov rax, [r14+65584]         # st_size, at offset 48
        ret
    1:  xor eax, eax
        ret
    num:                             # rax in decimal at rdi; rdi moves past it
        lea r8, [r14+65760]
        mov r9, r8
        mov ecx, 10
    1:  xor edx, edx
        div rcx
        add dl, 48
        dec r9
        mov [r9], dl
        test rax, rax
        jnz 1b
    2:  mov al, [r9]
        mov [rdi], al
        inc rdi
        inc r9
        cmp r9, r8
        jb 2b
        ret
    put:                             # rdx bytes at rsi to fd 1, all of them; exit 3 on failure
        test rdx, rdx
        jz 2f
        mov edi, 1
        mov eax, 1                   # write
        syscall
        test rax, rax
        jle 1f
        add rsi, rax
        sub rdx, rax
        jmp put
    1:  mov edi, 3
        jmp out
    2:  ret
    copy:                            # min(rbx, CAP) bytes of descriptor r8d to fd 1, from its
        cmp rbx, r15                 # offset, in 64 KiB reads; NULs for what it lacks
        jbe 1f
        mov rbx, r15
    1:  test rbx, rbx
        jz 9f
        mov edx, 65536
        cmp rbx, rdx
        jae 2f
        mov rdx, rbx
    2:  mov edi, r8d
        mov rsi, r14
        xor eax, eax                 # read
        syscall
        test rax, rax
        jle 5f
        sub rbx, rax
        mov rsi, r14
        mov rdx, rax
        call put
        jmp 1b
    5:  mov rdi, r14                 # at its end early: the rest as NULs
        mov ecx, 65536
        xor eax, eax
        rep stosb
    6:  test rbx, rbx
        jz 9f
        mov edx, 65536
        cmp rbx, rdx
        jae 7f
        mov rdx, rbx
    7:  sub rbx, rdx
        mov rsi, r14
        call put
        jmp 6b
    9:  ret

Only x86-64, as the launcher (``_setsid.py``): used where ``/proc/cpuinfo`` names an x86
vendor.  A command that puts another program in its place changes only how its own
sandbox's next commands are answered (docs/security.md).
"""

from __future__ import annotations

from ._setsid import printf_format, static_elf

__all__ = ["FRAMER", "FRAMER_SOURCE", "FRAMER_X86_64"]

_CODE = bytes.fromhex(
    "4889e54881ec000101004989e648837d00030f82a6000000488b75184531ff0fb60683e8"
    "3083f809770c4d6bff0a4901c748ffc6ebe9bf05000000e88a0000004989c4bf06000000"
    "e87d0000004989c54c89f7488b7510b9001000008a0684c0740c880748ffc648ffc7ffc9"
    "75eec6072048ffc74c89e0e86c000000c6072048ffc74c89e8e85e000000c6070a48ffc7"
    "4889fa4c29f24c89f6e87d00000041b8050000004c89e3e89500000041b8060000004c89"
    "ebe88700000031ffeb05bf02000000b8e70000000f05498db600000100b8050000000f05"
    "4885c07508498b8630000100c331c0c34d8d86e00001004d89c1b90a00000031d248f7f1"
    "80c23049ffc94188114885c075ed418a01880748ffc749ffc14d39c172f0c34885d27420"
    "bf01000000b8010000000f054885c07e084801c64829c2ebe2bf03000000eb83c34c39fb"
    "76034c89fb4885db7457ba000001004839d373034889da4489c74c89f631c00f054885c0"
    "7e104829c34c89f64889c2e8a3ffffffebcf4c89f7b90000010031c0f3aa4885db741aba"
    "000001004839d373034889da4829d34c89f6e878ffffffebe1c3")

FRAMER_X86_64 = static_elf(_CODE, 62)   # EM_X86_64
FRAMER_SOURCE = __doc__.split("::\n\n", 1)[1].split("\n\n", 1)[0] if __doc__ else ""

# The agent's side (``_agent.AGENT`` and ``_agent.SESSION`` include it): the framer's bytes
# in __fm_frb, and the functions that check it once and answer through it
FRAMER = "__fm_frb='" + printf_format(FRAMER_X86_64) + "'\n" + r"""
__fm_answer() {
  # $1, the answer's head (__FM__ ID RC FLAG), then the sizes of the output files open on
  # fds 5 and 6 and at most $__cap bytes of each.  A command with output is answered by the
  # framer once __fm_frprep has checked it; one it could not run (126, 127) or that was
  # given bad arguments (2) has written nothing, and the shell's way follows: wc, dd
  if [ -x "$__fm_d/fr" ] && { [ -s /proc/self/fd/5 ] || [ -s /proc/self/fd/6 ]; }; then
    "$__fm_d/fr" "$1" "$__cap"
    case $? in 2|126|127) ;; *) return 0;; esac
  fi
  __fm_sizes; __no=$__os; __ne=$__es
  [ "$__no" -gt "$__cap" ] && __no=$__cap
  [ "$__ne" -gt "$__cap" ] && __ne=$__cap
  printf '%s %s %s\n' "$1" "$__os" "$__es"
  [ "$__no" -gt 0 ] && __fm_put 5 "$__no"
  [ "$__ne" -gt 0 ] && __fm_put 6 "$__ne"
  return 0
}
__fm_frprep() {
  # The framer, written from __fm_frb to $__fm_d/fr in the first kick's background job, on
  # an x86 kernel, once it has answered a known file as the shell's way would
  __fm_x86 || return 0
  __x="$__fm_d/fr.new"; __y="$__fm_d/fr.t"
  { { printf "$__fm_frb" > "$__x" && command chmod 700 "$__x" && printf 'ab\n' > "$__y" \
      && [ "$("$__x" H 2 5<"$__y" 6<"$__y")" = "H 3 3
abab" ] && command mv -f "$__x" "$__fm_d/fr"; } || command rm -f -- "$__x"
    command rm -f -- "$__y"; } >/dev/null 2>&1
}
"""
