"""The benchmarks' records: what a record says about its run, ``python -m benchmarks compare``
(row by row, a figure more than 5 % worse flagged, exit status 1) and ``python -m benchmarks
tables`` (the tables of the README and the docs against their records), on made-up records.

The last test runs the tables' check on this checkout: a hand-edited figure in a table that
has a record fails it."""

import os
import re
import shutil
import subprocess

import pytest

from _benchmarks import assert_refused, figure, header
from benchmarks import compare, environment, records, tables
from benchmarks.cases import Case
from benchmarks.peers import OURS, TE, VLLM, op_name
from benchmarks.records import Figure, Result

H100 = "NVIDIA H100 80GB HBM3"
CASE = Case(16384, 7168, 64, 8, 128, "bf16")
SMALL = Case(256, 7168, 64, 8, 16, "bf16")


def _result(case, op, gpu, copy=500.0, one_call=None, host=30.0):
    us = dict(gpu=figure(gpu, 1.0), one_call=figure(one_call or gpu + 10), host=figure(host))
    copies = dict(gpu=figure(copy), one_call=figure(copy + 10), host=figure(9.0))
    return Result(case, op, 2_000_000_000, us, copies)


def _peer_results(scale=1.0):
    return [
        _result(CASE, op_name("permute", OURS), 590.0 * scale),
        _result(CASE, op_name("permute", TE), 1236.0),
        _result(CASE, op_name("permute", VLLM), 941.0),
        _result(CASE, op_name("unpermute weighted", OURS), 499.0),
        _result(CASE, op_name("unpermute weighted", TE), 511.0),
        _result(SMALL, op_name("permute", OURS), 18.0, copy=9.0, host=27.0),
        _result(SMALL, op_name("permute", TE), 35.0, copy=9.0),
    ]


def _save(path, results, **head):
    path.parent.mkdir(parents=True, exist_ok=True)
    records.save_results(path, header(**head), results)
    return path


# ------------------------------------------------------------------------------ the header


def test_slug():
    assert environment.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert environment.slug("AMD EPYC 7B13 64-Core Processor") == "amd-epyc-7b13-64-core-processor"
    assert environment.slug("  ") == "unknown"


SMI = (
    "NVIDIA H100 80GB HBM3, 00000000:19:00.0, 345, 1593, 1980, 2619, 1755, 2619, 580.95.05\n"
    "NVIDIA H100 80GB HBM3, 00000000:3B:00.0, 1980, 2619, 1980, 2619, [N/A], [N/A], 580.95.05\n"
)


def test_nvidia_smi_is_read_for_the_gpu_on_its_bus():
    gpu = environment.parse_smi(SMI, bus_id=0x3B)
    assert gpu == dict(
        name=H100,
        pci_bus_id="00000000:3B:00.0",
        sm_clock_mhz=1980,
        memory_clock_mhz=2619,
        max_sm_clock_mhz=1980,
        max_memory_clock_mhz=2619,
        application_sm_clock_mhz=None,
        application_memory_clock_mhz=None,
        driver="580.95.05",
    )
    assert environment.parse_smi(SMI)["sm_clock_mhz"] == 345  # no bus known: the first
    assert environment.parse_smi("garbage") is None


def test_commit_and_dirty_flag(tmp_path):
    assert environment.commit(str(tmp_path)) == (None, None)  # no git checkout
    git = shutil.which("git")
    if git is None:
        pytest.skip("needs git")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t")
    env["GIT_COMMITTER_EMAIL"] = "t@t"

    def run(*args):
        subprocess.run([git, *args], cwd=tmp_path, env=env, check=True, capture_output=True)

    run("init", "-q")
    (tmp_path / "a").write_text("1")
    run("add", "a")
    run("commit", "-q", "-m", "a")
    head, dirty = environment.commit(str(tmp_path))
    assert re.fullmatch(r"[0-9a-f]{40}", head) and dirty is False
    (tmp_path / "new.json").write_text("{}")  # untracked, as a new record is
    assert environment.commit(str(tmp_path)) == (head, False)
    (tmp_path / "a").write_text("2")
    assert environment.commit(str(tmp_path)) == (head, True)


def test_a_header_says_what_ran_where():
    head = environment.header("bench", "cpu", ["bench", "--quick"], "cpu (test)")
    assert head["what"] == "bench" and head["backend"] == "cpu (test)"
    assert head["command"] == "python -m benchmarks bench --quick"
    assert head["device"]["name"] == environment.cpu_name()
    assert head["device"]["slug"] == environment.slug(environment.cpu_name())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", head["date"])
    import moe_numba

    assert head["versions"]["moe_numba"] == moe_numba.__version__
    assert head["versions"]["numpy"]


def test_records_are_named_by_card_date_commit_and_run(tmp_path):
    head = header()
    first = records.default_path(head, results=str(tmp_path))
    assert first == str(tmp_path / "nvidia-h100-80gb-hbm3" / "2026-12-06-0123456-bench.json")
    records.save(first, head, [])
    assert records.default_path(head, results=str(tmp_path)).endswith("-bench-2.json")
    head.update(dirty=True, commit=None, what="layer")
    assert records.default_path(head, results=str(tmp_path)).endswith("nocommit-dirty-layer.json")


def test_a_figure_keeps_min_median_max():
    assert Figure.of([3.0, 1.0, 2.0, 10.0], 1e3) == Figure(1e3, 2.5e3, 1e4, 4)
    assert Figure.from_record(Figure(1, 2, 3, 3).record()) == Figure(1, 2, 3, 3)


# ------------------------------------------------------------------------------ compare


def _flagged(out):
    return [line for line in out.splitlines() if line.endswith("  WORSE")]


def _compare(tmp_path, old, new, *options, capsys):
    code = compare.main([str(old), str(new), *options])
    return code, capsys.readouterr().out


def test_compare_flags_a_figure_more_than_5_percent_worse(tmp_path, capsys):
    old = _save(tmp_path / "old.json", _peer_results())
    same = _save(tmp_path / "same.json", _peer_results())
    code, out = _compare(tmp_path, old, same, capsys=capsys)
    assert code == 0 and not _flagged(out)
    assert out.rstrip().endswith("42 figures compared, 0 more than 5% worse")

    slower = _save(tmp_path / "slower.json", _peer_results(scale=1.06))  # 6 % slower
    code, out = _compare(tmp_path, old, slower, capsys=capsys)
    assert code == 1
    key = f"{CASE.label()} | permute, moe-numba"
    block = out.split(key + "\n")[1]
    assert re.match(r"  gpu +590\.00 -> +625\.40 us +1\.060  WORSE$", block.splitlines()[0])
    assert len(_flagged(out)) == 2  # the GPU time and the one call (590 + 10 against 600)
    assert re.match(r"  one_call +600\.00 -> +635\.40 us +1\.059  WORSE$", block.splitlines()[1])
    assert out.rstrip().endswith(f"2 more than 5% worse: {key}")

    code, out = _compare(tmp_path, old, slower, "--threshold", "10", capsys=capsys)
    assert code == 0 and not _flagged(out)
    a_bit = _save(tmp_path / "a_bit.json", _peer_results(scale=1.04))
    assert _compare(tmp_path, old, a_bit, capsys=capsys)[0] == 0


def test_compare_flags_a_slower_copy_too(tmp_path, capsys):
    """Every figure counts, the copy's too: it says the machine moved."""
    old = _save(tmp_path / "old.json", [_result(CASE, "permute", 590.0, copy=500.0)])
    new = _save(tmp_path / "new.json", [_result(CASE, "permute", 590.0, copy=540.0)])
    code, out = _compare(tmp_path, old, new, capsys=capsys)
    assert code == 1 and re.search(r"^  copy gpu .*1\.080  WORSE$", out, flags=re.M)


def test_compare_lists_rows_that_one_record_lacks(tmp_path, capsys):
    old = _save(tmp_path / "old.json", _peer_results()[:3])
    new = _save(tmp_path / "new.json", _peer_results()[1:4])
    code, out = _compare(tmp_path, old, new, capsys=capsys)
    assert code == 0
    assert f"only in the old record: {CASE.label()} | permute, moe-numba" in out
    assert f"only in the new record: {CASE.label()} | unpermute weighted, moe-numba" in out


def _refused(argv, message, capsys):
    assert_refused(lambda: compare.main(argv), "python -m benchmarks compare", message, capsys)


def test_compare_refuses_records_of_two_cards_or_two_benchmarks(tmp_path, capsys):
    old = _save(tmp_path / "old.json", _peer_results())
    h200 = _save(tmp_path / "h200.json", _peer_results(), card="NVIDIA H200")
    _refused(
        [str(old), str(h200)],
        rf"argument NEW.json: {re.escape(str(old))} was made on {H100}, .*h200.json on "
        r"NVIDIA H200: compare records of one card$",
        capsys,
    )
    layer = _save(tmp_path / "layer.json", _peer_results(), what="layer")
    _refused(
        [str(old), str(layer)],
        r"argument NEW.json: a record of 'layer', .* of 'bench': compare records of one bench",
        capsys,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.json", "new.json"], r"argument OLD.json: cannot read missing.json: No such"),
        (["OLD", "NEW", "--threshold", "-1"], r"argument --threshold: expected a percentage"),
        (["OLD", "NEW", "--threshold", "x"], r"argument --threshold: .*; got 'x'$"),
        (["OLD"], r"the following arguments are required: NEW.json$"),
    ],
)
def test_compare_refuses_bad_options(tmp_path, argv, message, capsys):
    old = _save(tmp_path / "old.json", _peer_results())
    argv = [
        str(old) if a == "OLD" else str(tmp_path / "new.json") if a == "NEW" else a for a in argv
    ]
    (tmp_path / "new.json").write_text("not json")
    _refused(argv, message, capsys)


def test_compare_refuses_a_new_record_that_is_not_one(tmp_path, capsys):
    old = _save(tmp_path / "old.json", _peer_results())
    (tmp_path / "new.json").write_text("not json")
    _refused([str(old), str(tmp_path / "new.json")], r"argument NEW.json: .* is not JSON", capsys)


# ------------------------------------------------------------------------------ tables


RECORD = "benchmarks/results/nvidia-h100-80gb-hbm3/2026-12-06-0123456-peers.json"
MARKER = f"<!-- generated table: layout=peers; record={RECORD} -->"
END = "<!-- end of generated table -->"


def _readme(tmp_path, body, marker=MARKER):
    text = f"# x\n\n## Performance\n\nSome words.\n\n{marker}\n{body}\n{END}\n\n## More\n"
    (tmp_path / "README.md").write_text(text)


def _check(tmp_path, files=("README.md",), write=False, strict=False, capsys=None):
    outcomes, problems = tables.run(list(files), str(tmp_path), write=write)
    code = tables.report(outcomes, problems, strict)
    return code, outcomes, problems, capsys.readouterr().out if capsys else ""


def test_a_table_is_written_from_its_record_and_then_agrees(tmp_path, capsys):
    _save(tmp_path / RECORD, _peer_results(), what="peers")
    _readme(tmp_path, "| stale | table |\n| --- | --- |")
    code, outcomes, _, out = _check(tmp_path, capsys=capsys)
    assert code == 1 and outcomes[0].state == "differs"
    assert f"README.md:7: peers: DIFFERS from {RECORD}" in out
    code, outcomes, _, out = _check(tmp_path, write=True, capsys=capsys)
    assert [o.state for o in outcomes] == ["written"]
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("# x\n\n## Performance\n\nSome words.\n\n" + MARKER + "\n")
    assert text.endswith(f"{END}\n\n## More\n")
    assert f"*From the record `{RECORD}` ({H100}, 2026-12-06, commit 0123456).*" in text
    assert "| shape, op | copy | moe-numba | TE | vLLM |" in text
    # copy / moe-numba (its share of the copy) / TE / vLLM: GPU ms / one call ms / host µs
    row = (
        f"| {CASE.label()}, permute | 0.500 / 0.510 / 9 | 0.590 (85%) / 0.600 / 30 | "
        "1.236 / 1.246 / 30 | 0.941 / 0.951 / 30 |"
    )
    assert row in text
    assert f"| {CASE.label()}, unpermute weighted | 0.500 / 0.510 / 9 | " in text
    assert f"| {SMALL.label()}, permute | 0.009 / 0.019 / 9 | 0.018 (50%) " in text
    assert text.count(" | - |") == 2  # no vLLM unpermute, no vLLM at the small shape
    code, outcomes, _, out = _check(tmp_path, capsys=capsys)
    assert code == 0 and outcomes[0].state == "agrees"
    assert f"README.md:7: peers: agrees with {RECORD}" in out


def test_a_hand_edited_figure_fails_the_check(tmp_path, capsys):
    _save(tmp_path / RECORD, _peer_results(), what="peers")
    _readme(tmp_path, "")
    _check(tmp_path, write=True)
    path = tmp_path / "README.md"
    path.write_text(path.read_text().replace("0.590 (85%)", "0.550 (91%)"))
    code, outcomes, _, out = _check(tmp_path, capsys=capsys)
    assert code == 1 and outcomes[0].state == "differs"
    (difference,) = [line for line in out.splitlines() if line.startswith("  line ")]
    assert "the page has '| bf16 T=16384" in difference and "0.550 (91%)" in difference
    assert "the record gives '| bf16 T=16384" in difference and "0.590 (85%)" in difference


def test_the_newest_record_of_a_card(tmp_path, capsys):
    folder = tmp_path / "benchmarks" / "results" / "nvidia-h100-80gb-hbm3"
    _save(folder / "2026-12-06-0123456-peers.json", _peer_results(), what="peers")
    _save(folder / "2026-12-07-89abcde-bench.json", _peer_results(), what="bench")
    newer = _save(
        folder / "2026-12-07-0123456-peers.json",
        _peer_results(scale=2.0),
        what="peers",
        date="2026-12-07T10:00:00+00:00",
    )
    _readme(
        tmp_path,
        "",
        "<!-- generated table: layout=peers; record=newest:nvidia-h100-80gb-hbm3/peers -->",
    )
    _check(tmp_path, write=True)
    assert "0.590 (43%)" not in (tmp_path / "README.md").read_text()
    assert "1.180 (42%)" in (tmp_path / "README.md").read_text()
    code, outcomes, _, out = _check(tmp_path, capsys=capsys)
    assert code == 0 and os.path.relpath(newer, tmp_path) in out
    _readme(tmp_path, "", "<!-- generated table: layout=peers; record=newest:nvidia-h200/peers -->")
    code, outcomes, _, out = _check(tmp_path, capsys=capsys)
    assert code == 1 and "ERROR: no record of 'peers' under benchmarks/results/nvidia-h200" in out


def test_a_table_without_a_record_says_so(tmp_path, capsys):
    marker = "<!-- generated table: layout=peers; record=none (an old run) -->"
    _readme(tmp_path, "| a | b |\n| --- | --- |", marker)
    code, outcomes, _, out = _check(tmp_path, capsys=capsys)
    assert code == 1 and outcomes[0].state == "error"
    assert "record=none, and the block does not say 'from a run without a record'" in out
    _readme(tmp_path, "*Figures from a run without a record.*\n\n| a | b |\n| --- | --- |", marker)
    code, outcomes, _, out = _check(tmp_path, capsys=capsys)
    assert code == 0 and outcomes[0].state == "no record"
    assert "README.md:7: peers: no record (an old run)" in out
    assert out.rstrip().endswith("1 generated tables: 1 no record; 0 other problems")
    assert _check(tmp_path, strict=True)[0] == 1
    _check(tmp_path, write=True)  # left as it is
    assert "| a | b |" in (tmp_path / "README.md").read_text()


def test_a_table_of_figures_outside_a_block_fails(tmp_path, capsys):
    text = "# x\n\n## Performance\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n\n## Usage\n\n"
    text += "| not | figures |\n| --- | --- |\n"
    (tmp_path / "README.md").write_text(text)
    code, _, problems, out = _check(tmp_path, capsys=capsys)
    assert code == 1 and problems == [
        ("README.md:6", "a table of figures outside a generated block")
    ]
    docs = tmp_path / "docs"
    docs.mkdir()
    simple = "====  ====\na     b\n====  ====\n1     2\n====  ====\n"
    grid = "+---+---+\n| a | b |\n+===+===+\n| 1 | 2 |\n+---+---+\n"
    (docs / "peers.rst").write_text(
        f"Peers\n=====\n\n{simple}\n.. list-table::\n\n   * - a\n\n{grid}"
    )
    problems = tables.unmarked_tables("docs/peers.rst", str(tmp_path))
    assert [where for where, _ in problems] == [
        "docs/peers.rst:4",
        "docs/peers.rst:10",
        "docs/peers.rst:14",
    ]


def test_markers_that_do_not_pair_up(tmp_path, capsys):
    (tmp_path / "a.md").write_text(f"{MARKER}\n\n{MARKER}\n{END}\n{END}\n")
    (tmp_path / "b.md").write_text("<!-- generated table: layout=peers -->\n" + END + "\n")
    code, _, problems, out = _check(tmp_path, files=("a.md", "b.md"), capsys=capsys)
    assert code == 1
    assert problems == [
        ("a.md:1", "a block opened inside another"),
        ("a.md:5", "an end marker without its start"),
        ("b.md:1", "the marker names no record"),
    ]


def test_an_rst_table_from_a_sweep(tmp_path):
    path = "benchmarks/results/nvidia-h200/2026-12-06-0123456-sweep.json"
    results = [_result(CASE, "permute", 590.0), _result(CASE, "permute validate=False", 550.0)]
    results.append(_result(SMALL, "permute", 20.0, copy=9.0))
    _save(tmp_path / path, results, card="NVIDIA H200", what="sweep")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "performance.rst"
    marker = f".. generated table: layout=sweep; record={path}"
    page.write_text(f"Title\n=====\n\n{marker}\n.. end of generated table\n")
    outcomes, problems = tables.run(["docs/performance.rst"], str(tmp_path), write=True)
    assert problems == [] and outcomes[0].state == "written"
    width = len(CASE.label())
    border = "=" * width + "  =======  ======================"
    assert page.read_text().splitlines()[3:] == [
        marker,
        "",
        f"From the record ``{path}`` (NVIDIA H200, 2026-12-06, commit 0123456).",
        "",
        border,
        f"{'shape':<{width}}  permute  permute validate=False",
        border,
        f"{CASE.label()}  84.7     90.9",
        f"{SMALL.label():<{width}}  45.0     -",
        border,
        "",
        ".. end of generated table",
    ]
    assert tables.run(["docs/performance.rst"], str(tmp_path))[0][0].state == "agrees"


def test_a_layer_table(tmp_path):
    from benchmarks.layer import OPS

    row = dict(
        key="mixtral-8x7b T=16 fwd",
        model="mixtral-8x7b",
        T=16,
        unit="us",
        figures={
            "moe_numba": figure(1700.0).record(),
            "grouped_mm": figure(1692.0).record(),
            OPS: figure(11.1).record(),
        },
        copy={OPS: figure(2.2).record()},
        skipped=["batched_mm"],
        glue_share=0.23,
        rel_diff_vs_grouped_mm=1e-3,
    )
    row["pass"] = "fwd"
    path = tmp_path / "layer.json"
    records.save(path, header(what="layer"), [row])
    titles, rows = tables.layout_layer(records.load(path))
    assert titles == [
        *("model", "T", "pass", "moe_numba", "grouped_mm", "batched_mm"),
        *("share", "ratio", "p+u GPU", "copy GPU"),
    ]
    assert rows == [
        ["mixtral-8x7b", "16", "fwd", "1.700", "1.692", "skip", "23%", "1.00", "11.1", "2.2"]
    ]


def test_an_unknown_layout_or_option_is_an_error(tmp_path, capsys):
    _save(tmp_path / RECORD, _peer_results(), what="peers")
    _readme(tmp_path, "", f"<!-- generated table: layout=pie; record={RECORD} -->")
    code, _, _, out = _check(tmp_path, capsys=capsys)
    layouts = "peers, results, sweep, layer, decode"
    assert code == 1 and f"ERROR: layout 'pie' is none of {layouts}" in out
    _readme(tmp_path, "", f"<!-- generated table: layout=peers; record={RECORD}; colour=red -->")
    code, _, _, out = _check(tmp_path, capsys=capsys)
    assert code == 1 and "ERROR: layout 'peers': " in out and "colour" in out


def test_the_checkouts_tables_agree_with_their_records(capsys):
    """The README's and the docs' tables: each agrees with its record or says that it has
    none; no table of figures is outside a block."""
    root = environment.CHECKOUT
    outcomes, problems = tables.run(tables.default_files(root), root)
    assert tables.report(outcomes, problems) == 0, capsys.readouterr().out
    assert problems == []
    assert {o.state for o in outcomes} <= {"agrees", "no record"}
    pages = {o.block.path for o in outcomes}
    assert {"README.md", "docs/performance.rst", "docs/peers.rst", "docs/transformers.rst"} <= pages


def test_the_tables_command_line(capsys):
    with pytest.raises(SystemExit, match="^2$"):
        tables.main([])
    assert "one of the arguments --check --write is required" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="^2$"):
        tables.main(["--check", "no/such.md"])
    assert "argument FILE: no/such.md is not a file under" in capsys.readouterr().err
    assert tables.main(["--check", "README.md"]) == 0
    assert "README.md:" in capsys.readouterr().out


# ------------------------------------------------------------------------------ other rows


def test_distributed_rows_and_split():
    from benchmarks.distributed import format_split, record_rows

    split = {
        "forward": {"permute": Figure(900.0, 1000.0, 1100.0, 5), "sort": Figure(1, 3000.0, 4, 5)},
        "backward": {"permute": Figure(1, 2000.0, 3, 5), "sort": Figure(1, 4000.0, 5, 5)},
    }
    rows = record_rows(split)
    assert [r["key"] for r in rows] == [
        "forward permute",
        "forward sort",
        "backward permute",
        "backward sort",
    ]
    assert rows[0]["figures"]["slowest rank"] == dict(min=900.0, median=1000.0, max=1100.0, n=5)
    lines = format_split(split, "title").splitlines()
    assert lines[0] == "title"
    assert lines[2].split() == ["permute", "1.00", "2.00", "30.0%"]
    assert lines[-1].split() == ["total", "4.00", "6.00", "100%"]


def test_memory_rows():
    from benchmarks.memory import record_row

    shape = dict(num_tokens=8, hidden=4, topk=2, num_experts=4, alignment=1, num_rows=16)
    measured = dict(shape=dict(shape, weighted=True), step_peak_bytes=4096, forward_held_bytes=1024)
    row = record_row(measured)
    assert row["key"] == "T=8 H=4 K=2 E=4 A=1 weighted" and row["unit"] == "bytes"
    assert row["figures"]["step_peak"] == dict(min=4096, median=4096, max=4096, n=1)
    assert row["figures"]["forward_held"]["median"] == 1024
