"""Every error a user can hit returns an error (etbuild.runtime.Error), never a crash:
truncated and bit-flipped program files, wrong inputs, a missing kernel, an undersized
memory bank, a missing method."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from etbuild_test_support import interruptible_child
from rt_helpers import build_with_executorch


def _program_size(data: bytes) -> int:
    assert data[8:12] == b"eh00"
    return int.from_bytes(data[16:24], "little")


def test_missing_file(rt, tmp_path):
    with pytest.raises(rt.Error, match="cannot open"):
        rt.load(str(tmp_path / "nope.pte"))


def test_not_a_program(rt, tmp_path):
    p = tmp_path / "x.pte"
    p.write_bytes(b"hello world, this is not a program at all" * 4)
    with pytest.raises(rt.Error, match="not a program file"):
        rt.load(str(p))
    p.write_bytes(b"")
    with pytest.raises(rt.Error, match="empty"):
        rt.load(str(p))


def test_truncated(rt, zoo_build, tmp_path):
    data = (zoo_build("mlp") / "model.pte").read_bytes()
    psize = _program_size(data)
    cuts = sorted(
        {
            1,
            4,
            8,
            12,
            39,
            40,
            100,
            psize // 2,
            psize - 1,
            psize,
            psize + 1,
            len(data) // 2,
            len(data) - 1,
        }
    )
    for n in cuts:
        p = tmp_path / f"t{n}.pte"
        p.write_bytes(data[:n])
        with pytest.raises(rt.Error):
            prog = rt.load(str(p))
            prog.run([torch.randn(4, 64)])


def _segment(data: bytes, index: int) -> tuple[int, int]:
    """(file offset, size) of segment ``index`` of a program file."""
    from etbuild.pipeline import pte

    f = pte.read(data)
    seg = f.program.segments[index]
    return f.segment_base + seg.offset, seg.size


def test_a_corrupted_program_is_an_error_not_a_wrong_answer(rt, zoo_build, tmp_path):
    """Checksums (emit writes them; load checks them): a changed weight, two bytes slipped
    into the constant segment, a changed flatbuffer byte each fail at load."""
    data = (zoo_build("mlp") / "model.pte").read_bytes()
    start, size = _segment(data, 0)  # the constant segment
    flipped = bytearray(data)
    flipped[start + size // 2] ^= 0x40
    inserted = data[: start + 100] + b"\x00\x7f" + data[start + 100 :]
    fb = bytearray(data)
    fb[_program_size(data) - 3] ^= 1
    for name, bad, message in [
        ("flipped", bytes(flipped), "segment 0 of the program does not match its checksum"),
        ("inserted", inserted, "the file is corrupt; rebuild it or copy it again"),
        ("flatbuffer", bytes(fb), "(checksum|failed verification)"),
    ]:
        p = tmp_path / f"{name}.pte"
        p.write_bytes(bad)
        with pytest.raises(rt.Error, match=message):
            rt.load(str(p)).run([torch.randn(4, 64)])


def test_wrong_inputs(rt, zoo_build):
    prog = rt.load(str(zoo_build("mobilenet") / "model.pte"))
    x = torch.randn(1, 3, 224, 224)
    with pytest.raises(rt.Error, match="input 0: expected dtype Float, got Long"):
        prog.run([x.long()])
    with pytest.raises(rt.Error, match=r"input 0: expected sizes \[1, 3, 224, 224\], got"):
        prog.run([torch.randn(1, 3, 224, 223)])
    with pytest.raises(rt.Error, match="input 0: expected 4 dims, got 3"):
        prog.run([torch.randn(3, 224, 224)])
    with pytest.raises(rt.Error, match="takes 1 inputs, got 2"):
        prog.run([x, x])
    with pytest.raises(rt.Error, match="expected a CPU tensor"):
        prog.run(["not a tensor"])
    # Non-contiguous input tensors are accepted (made contiguous).
    (out,) = prog.run([x.transpose(2, 3).contiguous().transpose(2, 3)])
    assert out.shape == (1, 1000)


def test_dynamic_bounds(rt, zoo_build):
    prog = rt.load(str(zoo_build("mlp") / "model.pte"))
    with pytest.raises(rt.Error, match=r"exceed the dynamic bound \[16, 64\]"):
        prog.run([torch.randn(17, 64)])
    with pytest.raises(rt.Error, match=r"exceed the dynamic bound"):
        prog.run([torch.randn(2, 128)])
    (out,) = prog.run([torch.randn(2, 64)])
    assert out.shape == (2, 10)


def test_missing_method(rt, zoo_build):
    prog = rt.load(str(zoo_build("mlp") / "model.pte"))
    with pytest.raises(rt.Error, match="no method named 'backward'"):
        prog.run([torch.randn(2, 64)], method="backward")


def test_undersized_bank(rt, zoo_build):
    prog = rt.load(str(zoo_build("mobilenet") / "model.pte"))
    banks = prog.method_meta()["memory_banks"]
    assert len(banks) >= 1 and banks[0] > 0
    small = [banks[0] - 1] + banks[1:]
    with pytest.raises(rt.Error, match=r"memory bank 0 \('sram'\): buffer has .* plans"):
        prog.init_method("forward", bank_sizes=small)
    with pytest.raises(rt.Error, match="plans 1 memory banks, 0 were given"):
        prog.init_method("forward", bank_sizes=[])
    prog.init_method("forward", bank_sizes=banks)  # exactly the plan is enough
    (out,) = prog.run([torch.randn(1, 3, 224, 224)])
    assert out.shape == (1, 1000)


def test_too_small_temp_memory(rt, zoo_build):
    prog = rt.load(str(zoo_build("resnet18") / "model.pte"))
    prog.init_method("forward", temp_bytes=64)
    with pytest.raises(rt.Error, match="aten::convolution.out.*temp allocator"):
        prog.run([torch.randn(1, 3, 224, 224)])


@pytest.mark.oracle
def test_missing_kernels_reported_together(rt, tmp_path):
    pytest.importorskip("executorch")

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.fmod(x, 0.7) + torch.atan2(x, x)

    path = build_with_executorch(M(), [torch.randn(4, 3)], tmp_path / "m.pte")
    prog = rt.load(str(path))
    with pytest.raises(rt.Error) as info:
        prog.run([torch.randn(4, 3)])
    msg = str(info.value)
    assert "2 operator(s) have no kernel" in msg
    assert "aten::fmod.Scalar_out" in msg and "aten::atan2.out" in msg


FUZZ_SCRIPT = textwrap.dedent(
    """
    import random, sys, torch
    import etbuild.runtime as rt
    src, tmp, inputs = sys.argv[1], sys.argv[2], sys.argv[5]
    seed, count = int(sys.argv[3]), int(sys.argv[4])
    data = bytearray(open(src, "rb").read())
    psize = int.from_bytes(data[16:24], "little")
    ins = torch.load(inputs)
    rng = random.Random(seed)
    outcomes = {"error": 0, "ran": 0}
    for i in range(count):
        d = bytearray(data)
        # Mostly the flatbuffer (structure), sometimes the constant data.
        hi = psize if rng.random() < 0.85 else len(d)
        for _ in range(rng.choice([1, 1, 2, 4])):
            pos = rng.randrange(0, hi)
            d[pos] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
        open(tmp, "wb").write(d)
        try:
            prog = rt.load(tmp)
            for name in prog.method_names:
                outs = prog.run(list(ins), method=name)
                assert all(isinstance(o, torch.Tensor) for o in outs)
            outcomes["ran"] += 1
        except rt.Error:
            outcomes["error"] += 1
    print(outcomes)
    """
)


@pytest.mark.parametrize("model,count", [("mlp", 400), ("transformer", 250)])
def test_bit_flips_never_crash(zoo_build, tmp_path, model, count):
    run_dir = zoo_build(model)
    ref = torch.load(run_dir / "reference.pt")
    inputs = tmp_path / "inputs.pt"
    torch.save(ref["inputs"], inputs)
    script = tmp_path / "fuzz.py"
    script.write_text(FUZZ_SCRIPT)
    res = subprocess.run(
        [
            sys.executable,
            str(script),
            str(run_dir / "model.pte"),
            str(tmp_path / "f.pte"),
            "7",
            str(count),
            str(inputs),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, f"crashed (rc={res.returncode}): {res.stderr[-2000:]}"
    assert "'error'" in res.stdout


@pytest.mark.parametrize("budget", [0, 1000])
def test_a_looping_program_stops_at_its_instruction_budget(rt, tmp_path, budget):
    """A jump back on a condition that never changes loops forever: the run stops with an
    error after the budget (the program's default for 0) instead of hanging."""
    from rt_helpers import write_loop_program

    x = torch.randn(2, 3)
    prog = rt.load(str(write_loop_program(tmp_path / "loop.pte", jump_back=True)),
                   instruction_budget=budget)  # fmt: skip
    want = 2 * 65536 if budget == 0 else budget  # two instructions, times the loop factor
    with pytest.raises(rt.Error, match=f"the method ran {want} instructions, its budget"):
        prog.run([x])
    done = rt.load(str(write_loop_program(tmp_path / "once.pte", jump_back=False)))
    torch.testing.assert_close(done.run([x])[0], x + x)
    with pytest.raises(rt.Error, match="instruction_budget must be >= 1"):
        rt.load(str(tmp_path / "once.pte"), instruction_budget=-1)


def test_ctrl_c_interrupts_a_long_run(tmp_path):
    """A run that would take hours (a loop under a huge instruction budget) stops within a
    moment of SIGINT with KeyboardInterrupt, and the program runs again afterwards."""
    import signal
    import time
    from pathlib import Path

    from rt_helpers import write_loop_program

    loop = write_loop_program(tmp_path / "loop.pte", jump_back=True)
    once = write_loop_program(tmp_path / "once.pte", jump_back=False)
    child = textwrap.dedent(
        f"""
        import sys, torch
        import etbuild.runtime as rt
        prog = rt.load({str(loop)!r}, instruction_budget=10**15)
        x = torch.randn(2, 3)
        print("running", flush=True)
        try:
            prog.run([x])
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        again = rt.load({str(once)!r}).run([x])[0]
        print("again", bool(torch.equal(again, x + x)), flush=True)
        """
    )
    with interruptible_child([sys.executable, "-c", child], cwd=Path(__file__).parent) as proc:
        assert proc.stdout.readline().strip() == "running"
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 3.0
    assert out.split() == ["interrupted", "again", "True"], (out, err)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_runs_from_the_main_thread_share_one_helper_thread(tmp_path):
    """A run called from the main thread executes on a helper thread (the main one meanwhile
    runs Python's signal handlers): one per program, started by its first run and joined when
    the program goes, not one per call (starting a thread cost more than a small model's run)."""
    from rt_helpers import write_loop_program

    once = write_loop_program(tmp_path / "once.pte", jump_back=False)
    child = textwrap.dedent(
        f"""
        import gc, os, torch
        import etbuild.runtime as rt
        def threads():
            return len(os.listdir("/proc/self/task"))
        x = torch.randn(2, 3)
        prog = rt.load({str(once)!r})
        before = threads()
        ok = all(torch.equal(prog.run([x])[0], x + x) for _ in range(1))
        first = threads()
        ok = ok and all(torch.equal(prog.run([x])[0], x + x) for _ in range(50))
        later = threads()
        del prog
        gc.collect()
        print(ok, first - before, later - before, threads() - before)
        """
    )
    res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).parent)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", "1", "1", "0"], res.stdout


def test_runner_stops_a_looping_program(tmp_path, zoo_build):
    from rt_helpers import write_loop_program

    from etbuild.pipeline import etbt

    runner = zoo_build("mobilenet") / "runtime" / "bin" / "etb_runner"  # has aten::add.out
    pte = write_loop_program(tmp_path / "loop.pte", jump_back=True)
    etbt.write(tmp_path / "x.etbt", torch.randn(2, 3))
    res = subprocess.run([str(runner), str(pte), "--input", str(tmp_path / "x.etbt"),
                          "--instruction-budget", "500"], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert res.returncode == 1
    assert "the method ran 500 instructions, its budget" in res.stderr


def test_only_regular_files_load(rt, tmp_path):
    """A FIFO (which would block until a writer came) and a directory are refused at once; a
    path with a NUL character is refused, not cut short to another file's name."""
    import os

    fifo = tmp_path / "fifo.pte"
    os.mkfifo(fifo)
    with pytest.raises(rt.Error, match="fifo.pte is not a regular file"):
        rt.load(str(fifo))
    with pytest.raises(rt.Error, match="is not a regular file"):
        rt.load(str(tmp_path))
    with pytest.raises(rt.Error, match="the program path contains a NUL character"):
        rt.load(str(tmp_path / "model.pte") + "\0.bak")


def test_a_program_file_changed_after_load_does_not_matter(rt, zoo_build, tmp_path):
    """The file is read at load: truncating or rewriting it later cannot fault the process."""
    import shutil

    src = zoo_build("mlp") / "model.pte"
    path = tmp_path / "model.pte"
    shutil.copy(src, path)
    prog = rt.load(str(path))
    x = torch.load(zoo_build("mlp") / "reference.pt", weights_only=True)["inputs"]
    want = prog.run(list(x))
    path.write_bytes(b"")  # truncated to nothing
    got = prog.run(list(x))
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_threads_calling_one_program_take_turns(rt, zoo_build):
    """Runs from several Python threads on one loaded program each get their own outputs (they
    share the planned memory, so they take turns); re-initialising during a run is refused."""
    import threading

    run_dir = zoo_build("mlp")
    prog = rt.load(str(run_dir / "model.pte"))
    (x,) = torch.load(run_dir / "reference.pt", weights_only=True)["inputs"]
    xs = [x * (1 + i / 4) for i in range(4)]
    want = [prog.run([xi])[0] for xi in xs]
    assert len({w.sum().item() for w in want}) == 4  # different inputs, different outputs
    bad: list[int] = []

    def worker(i: int) -> None:
        for _ in range(40):
            if not torch.equal(prog.run([xs[i]])[0], want[i]):
                bad.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


def test_init_method_during_a_run_is_refused(rt, tmp_path):
    import threading
    import time

    from rt_helpers import write_loop_program

    prog = rt.load(str(write_loop_program(tmp_path / "loop.pte", jump_back=True)),
                   instruction_budget=20_000_000)  # fmt: skip
    done = threading.Event()
    errors: list[str] = []

    def long_run() -> None:
        try:
            prog.run([torch.randn(2, 3)])
        except rt.Error as exc:
            errors.append(str(exc))
        done.set()

    t = threading.Thread(target=long_run)
    t.start()
    time.sleep(0.2)
    refused = not done.is_set()
    if refused:
        with pytest.raises(rt.Error, match="cannot initialise method 'forward' while another"):
            prog.init_method("forward")
    t.join()
    assert refused, "the run finished before init_method was tried: raise the budget"
    assert len(errors) == 1 and "its budget" in errors[0], errors
    prog.init_method("forward")  # after the run: allowed


def test_prepared_bytes_during_a_run_waits_for_it(tmp_path):
    """prepared_bytes() asked while another thread runs the program waits for the run (without
    holding the GIL, which the run needs to return), in a process with a deadline."""
    import subprocess
    import sys

    from rt_helpers import write_loop_program

    pte = write_loop_program(tmp_path / "loop.pte", jump_back=True)
    script = (
        "import sys, threading, time, torch\n"
        f"sys.path[:0] = {sys.path!r}\n"
        "import etbuild.runtime as rt\n"
        f"prog = rt.load({str(pte)!r}, instruction_budget=20_000_000)\n"
        "def long_run():\n"
        "    try:\n"
        "        prog.run([torch.randn(2, 3)])\n"
        "    except rt.Error:\n"
        "        pass\n"
        "t = threading.Thread(target=long_run)\n"
        "t.start()\n"
        "time.sleep(0.2)\n"
        "print('during', t.is_alive(), prog.prepared_bytes())\n"
        "t.join()\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0 and "during True 0" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize(("op", "offset", "error"), [
    ("add", 0, None),  # in place: add may write its output over `self`
    ("add", 24, None),  # right after x: apart
    ("add", 8, "output 'out' overlaps argument 'self'"),
    ("permute", 8, "output 'out' overlaps argument 'self'"),  # a crash a fuzz campaign found
    ("permute", 0, "output 'out' overlaps argument 'self'"),  # permute is never in place
])  # fmt: skip
def test_an_output_sharing_memory_with_an_input_is_refused(rt, tmp_path, op, offset, error):
    """A memory plan that puts a kernel's output over memory it reads is refused when the
    method loads, unless the output is exactly an input the op may overwrite (ops_yaml
    `in_place`)."""
    from rt_helpers import write_one_op_program

    path = write_one_op_program(tmp_path / "p.pte", op, offset)
    x = torch.randn(2, 3)
    if error is None:
        torch.testing.assert_close(rt.load(str(path)).run([x])[0], x + x)
        return
    prog = rt.load(str(path))
    with pytest.raises(rt.Error, match=f"method 'forward': instruction 0: aten::{op}.*{error} "
                       "in memory; the program's memory plan is invalid"):  # fmt: skip
        prog.run([x])
