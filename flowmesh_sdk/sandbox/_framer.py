r"""The answer framer the agent writes into an x86-64 sandbox, a static program of two uses.

``fr HEAD CAP`` writes, to its standard output (the channel), ``HEAD``, the sizes of the
files open on fds 5 and 6 (a command's stdout and stderr), a newline, then at most ``CAP``
bytes of each: the answer ``__FM__ ID RC FLAG OUTBYTES ERRBYTES`` and its bytes
(flowmesh_sdk/sandbox/__init__.py).

``fr ID CAP PID`` streams a started process's output (``__fm_proc``): until process ``PID``
ends, it writes to fd 7 (the channel) a frame ``__FMP__ ID 1|2 LEN`` and LEN bytes for what
fd 5 or 6 gained (up to ``CAP`` in all, at most 1 MiB a frame), looking again when the
process ends or after a wait of 2 ms after a frame, else 2, 5, 10, 20, then 50 ms (a
``poll`` on the process's pidfd: the end is seen at once, not at the next look).  Then it
writes ``OUTBYTES ERRBYTES`` (the files' whole sizes) to its standard output, for the
agent's end frame.

Why: without it, a command with output was answered by ``wc -c`` (the sizes) and one ``dd``
per stream (the bytes), dynamically linked programs the agent forks and executes per
command: ``exec("echo hi")`` cost 3.2 ms where ``exec("true")``, which has no output and
forks nothing to answer, cost 1.4 ms (a session command 2.3 ms against 0.5).  A streamed
process looked at its files with ``wc`` and ``dd`` and waited with ``sleep`` between looks,
three more programs per look: ``start(cmd) + wait()`` and ``exec(on_stdout=...)`` cost
9-10 ms.  This program is a static ELF with no loader and no libc (882 bytes of code): one
fork and exec per answer or streamed process, of a program that makes six kinds of
system call (fstat, read, write, pidfd_open, poll, exit).

It keeps ``dd``'s framing exactly: the sizes are each file's at the moment it looks
(fstat), the bytes are read from the descriptor's offset, and a file that is shorter than
its size said (a background job truncated it meanwhile) is padded with NULs, so a command
can never shift the framing.  It exits 0 once all is written, 2 without writing anything
when it is given no arguments, 4 without writing anything when it cannot watch ``PID``
(no pidfd_open or no poll of one: a process that is gone already is streamed as ended),
and 3 when a write fails (the channel is gone).  The agent checks both uses once
(``__fm_frprep``) before it uses it, and answers as before where it is absent
(``__fm_answer``, ``__fm_proc``).

Its source, as GNU ``as`` assembles it (``as fr.s && objcopy -O binary -j .text``: the
bytes below; tests/test_setsid_launcher.py assembles it again where ``as`` is installed)::

    .intel_syntax noprefix
    _start:                          # [rsp]: argc, argv[0], argv[1], argv[2] = CAP, argv[3] = PID
        mov rbp, rsp
        sub rsp, 65856               # r14: a 64 KiB buffer, fstat's 144 bytes, 20 bytes for a
        mov r14, rsp                 #      number's digits; the stream's record at rbp-88 .. rbp-24
        mov r10d, 1                  # r10: the descriptor put writes to (fd 1)
        cmp qword ptr [rbp], 3       # fewer than two arguments: exit 2
        jb bad
        mov rsi, [rbp+24]
        call dec
        mov r15, rax                 # r15: CAP
        cmp qword ptr [rbp], 4
        jae stream
        mov edi, 5                   # fr HEAD CAP -- r12, r13: the sizes of fds 5 and 6
        call size
        mov r12, rax
        mov edi, 6
        call size
        mov r13, rax
        mov rdi, r14                 # the header in the buffer: HEAD (at most 4096 bytes),
        mov rsi, [rbp+16]            # " ", r12, " ", r13, "\n"
        call str
        mov byte ptr [rdi], 32
        inc rdi
        mov rax, r12
        call num
        mov byte ptr [rdi], 32
        inc rdi
        mov rax, r13
        call num
        call line
        mov r8d, 5                   # then the bytes of fd 5, and of fd 6
        mov rbx, r12
        call copy
        mov r8d, 6
        mov rbx, r13
        call copy
        xor edi, edi
        jmp out
    stream:                          # fr ID CAP PID -- frames of what fds 5 and 6 gain until PID ends;
                                     # rbp-88: poll's record (pidfd, POLLIN); -80, -72: bytes sent of
                                     # fds 5, 6; -64, -56: their sizes; -48: moved; -40: the next
                                     # wait (ms); -32: done
        mov rsi, [rbp+32]
        call dec
        mov edi, eax
        xor esi, esi
        mov eax, 434                 # pidfd_open(PID, 0)
        syscall
        mov qword ptr [rbp-32], 1 # done: PID is gone already (ESRCH)
        cmp rax, -3
        je 2f
        test rax, rax
        js nopid
        mov [rbp-88], eax         # poll's record: the pidfd, POLLIN
        mov dword ptr [rbp-84], 1
        xor edx, edx                 # a first look that waits for nothing: a pidfd this kernel
        call look                    # cannot poll ends it here, before anything is written
        test rax, rax
        js nopid
        test word ptr [rbp-82], 0xfffe
        jnz nopid
        mov [rbp-32], rax         # done: PID has ended
    2:  mov r10d, 7                  # the frames go to fd 7 (the channel)
        xor eax, eax
        mov [rbp-80], rax         # bytes sent of fd 5, of fd 6
        mov [rbp-72], rax
        mov dword ptr [rbp-40], 2 # the next wait (ms)
    3:  mov qword ptr [rbp-48], 0 # moved: whether a frame was sent
        mov edi, 5
        lea r13, [rbp-80]
        mov r12d, 49
        call send
        mov edi, 6
        lea r13, [rbp-72]
        mov r12d, 50
        call send
        cmp qword ptr [rbp-32], 0
        jg 6f
        mov edx, [rbp-40]         # wait: 2 ms after a frame, else 2, 5, 10, 20, then 50 ms
        mov ecx, 2
        cmp qword ptr [rbp-48], 0
        je 4f
        mov edx, ecx
        jmp 5f
    4:  mov ecx, 5
        cmp edx, 5
        jb 5f
        mov ecx, 10
        cmp edx, 10
        jb 5f
        mov ecx, 20
        cmp edx, 20
        jb 5f
        mov ecx, 50
    5:  mov [rbp-40], ecx
        call look
        mov [rbp-32], rax         # done when > 0 (an error such as EINTR: look again)
        jmp 3b
    6:  mov r10d, 1                  # then a line on fd 1: the files' sizes
        mov rdi, r14
        mov rax, [rbp-64]
        call num
        mov byte ptr [rdi], 32
        inc rdi
        mov rax, [rbp-56]
        call num
        call line
        xor edi, edi
        jmp out
    nopid:
        mov edi, 4
        jmp out
    bad:
        mov edi, 2
    out:
        mov eax, 231                 # exit_group(edi)
        syscall
    look:                            # poll the pidfd for edx ms -> rax: 1 once PID has ended
        lea rdi, [rbp-88]
        mov esi, 1
        mov eax, 7                   # poll
        syscall
        ret
    send:                            # frames "__FMP__ ID S K" and K bytes of what the file on
        mov r8d, edi                 # fd edi gained, up to CAP, in frames of at most 1 MiB:
        call size                    # r12b is S, r13 its counters (sent; at r13+16 the size)
        mov [r13+16], rax
        cmp rax, r15
        jbe 1f
        mov rax, r15
    1:  sub rax, [r13]
        jbe 9f
        mov rbx, rax
        mov qword ptr [rbp-48], 1
    2:  mov eax, 1048576
        cmp rbx, rax
        jae 3f
        mov rax, rbx
    3:  sub rbx, rax
        add [r13], rax
        push rbx
        push rax
        mov rdi, r14
        mov rax, 0x205f5f504d465f5f  # "__FMP__ "
        mov [rdi], rax
        add rdi, 8
        mov rsi, [rbp+16]
        call str
        mov byte ptr [rdi], 32
        mov [rdi+1], r12b
        mov byte ptr [rdi+2], 32
        add rdi, 3
        mov rax, [rsp]
        call num
        call line
        pop rbx
        call copy
        pop rbx
        test rbx, rbx
        jnz 2b
    9:  ret
    dec:                             # rsi: decimal digits -> rax, up to the first non-digit
        xor eax, eax
    1:  movzx ecx, byte ptr [rsi]
        sub ecx, 48
        cmp ecx, 9
        ja 2f
        imul rax, rax, 10
        add rax, rcx
        inc rsi
        jmp 1b
    2:  ret
    str:                             # the string at rsi (at most 4096 bytes) to rdi, rdi past it
        mov ecx, 4096
    1:  mov al, [rsi]
        test al, al
        jz 2f
        mov [rdi], al
        inc rsi
        inc rdi
        dec ecx
        jnz 1b
    2:  ret
    line:                            # a newline after the line at r14 .. rdi, and the line put
        mov byte ptr [rdi], 10
        inc rdi
        mov rdx, rdi
        sub rdx, r14
        mov rsi, r14
        jmp put
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
        lea r11, [r14+65760]
        mov r9, r11
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
        cmp r9, r11
        jb 2b
        ret
    put:                             # rdx bytes at rsi to fd r10d, all of them; exit 3 on failure
        test rdx, rdx
        jz 2f
        mov edi, r10d
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
    copy:                            # min(rbx, CAP) bytes of descriptor r8d to put, from its
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
    "4889e54881ec400101004989e641ba0100000048837d00030f8295010000488b7518e82b"
    "0200004989c748837d0004736abf05000000e85a0200004989c4bf06000000e84d020000"
    "4989c54c89f7488b7510e815020000c6072048ffc74c89e0e84e020000c6072048ffc74c"
    "89e8e840020000e80c02000041b8050000004c89e3e88702000041b8060000004c89ebe8"
    "7902000031ffe91d010000488b7520e8ae01000089c731f6b8b20100000f0548c745e001"
    "0000004883f8fd74334885c00f88e60000008945a8c745ac0100000031d2e8e800000048"
    "85c00f88cc00000066f745aefeff0f85c0000000488945e041ba0700000031c0488945b0"
    "488945b8c745d80200000048c745d000000000bf050000004c8d6db041bc31000000e8ad"
    "000000bf060000004c8d6db841bc32000000e89900000048837de0007f448b55d8b90200"
    "000048837dd000740489caeb23b90500000083fa057219b90a00000083fa0a720fb91400"
    "000083fa147205b932000000894dd8e843000000488945e0eb8541ba010000004c89f748"
    "8b45c0e81f010000c6072048ffc7488b45c8e810010000e8dc00000031ffeb0cbf040000"
    "00eb05bf02000000b8e70000000f05488d7da8be01000000b8070000000f05c34189f8e8"
    "bd000000498945104c39f876034c89f8492b450076674889c348c745d001000000b80000"
    "10004839c373034889d84829c34901450053504c89f748b85f5f464d505f5f2048890748"
    "83c708488b7510e844000000c6072044886701c64702204883c703488b0424e873000000"
    "e83f0000005be8c20000005b4885db75a4c331c00fb60e83e93083f909770c486bc00a48"
    "01c848ffc6ebe9c3b9001000008a0684c0740c880748ffc648ffc7ffc975eec3c6070a48"
    "ffc74889fa4c29f24c89f6eb51498db600000100b8050000000f054885c07508498b8630"
    "000100c331c0c34d8d9ee00001004d89d9b90a00000031d248f7f180c23049ffc9418811"
    "4885c075ed418a01880748ffc749ffc14d39d972f0c34885d274214489d7b8010000000f"
    "054885c07e084801c64829c2ebe4bf03000000e9acfeffffc34c39fb76034c89fb4885db"
    "7457ba000001004839d373034889da4489c74c89f631c00f054885c07e104829c34c89f6"
    "4889c2e8a2ffffffebcf4c89f7b90000010031c0f3aa4885db741aba000001004839d373"
    "034889da4829d34c89f6e877ffffffebe1c3")

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
  # an x86 kernel, once it has answered a known file as the shell's way would, and
  # streamed it (or said it cannot here)
  __fm_x86 || return 0
  __x="$__fm_d/fr.new"; __y="$__fm_d/fr.t"
  { { printf "$__fm_frb" > "$__x" && command chmod 700 "$__x" && printf 'ab\n' > "$__y" \
      && [ "$("$__x" H 2 5<"$__y" 6<"$__y")" = "H 3 3
abab" ] && __fm_frs "$__x" "$__y" && command mv -f "$__x" "$__fm_d/fr"; } || command rm -f -- "$__x"
    command rm -f -- "$__y"; } >/dev/null 2>&1
}
__fm_frs() {
  # the framer $1 streaming the file $2 of a process that ends at once: its frames and the
  # sizes, or nothing and 4 (no pidfd here: __fm_proc streams the shell's way)
  : & __z=$("$1" 7 2 $! 5<"$2" 6<"$2" 7>&1)
  case $?:$__z in "0:__FMP__ 7 1 2
ab__FMP__ 7 2 2
ab3 3"|4:) return 0;; esac
  return 1
}
"""
