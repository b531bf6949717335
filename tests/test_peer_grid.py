"""Transformer Engine's permutation test grid, against the Paddle-contract API on torch tensors.

The grid is that of TE's ``tests/pytorch/test_permutation.py`` with fewer tokens (hidden sizes,
expert counts, top-k, dtypes and alignment are TE's); the references are plain torch
(:mod:`_peer_refs`). How TE's variants map onto the contract:

- TE's mask map is the Paddle layout with ``padding_alignment=1`` (its ``num_out_tokens``
  there is the number of routed pairs, drawn over the whole ``[T, E]`` grid);
- its padded variant is ``padding_alignment=align_size`` (16), the capacities given as a
  host list or counted on the device (``override_buffer_size``);
- its index map that keeps ``num_out_tokens < T * K`` rows, and its mask-map capacity drop,
  are ``override_buffer_size`` with alignment 1: rows past R are dropped, in token order per
  expert; per-expert capacities are ``tokens_per_expert`` below the counts.

Bit for bit: the forward's rows, row map, row probabilities, expert indices and slot
probabilities (copies); the unweighted combine and the permute's data gradient (a float32
sum in ascending expert id, which the reference does step by step); the permute's
probability gradient and the unweighted unpermute's (copies); the unpermute's row gradient
(one float32 product). Within TE's tolerances (``_peer_refs.TE_TOLERANCES``), where the
contract fixes a float32 order that the float64 references do not follow: the weighted
combine (fused multiply-adds; the data dtype's tolerance) and the weighted probability
gradient (the fixed dot-product tree; the float32 tolerance, see PROB_GRAD_TOLERANCE); and
TE's test with the probabilities applied inside the expert, whose reference is torch's own
autograd of index ops.

Each test runs on the CPU (the Cython backend) and, where torch finds one, on CUDA.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import pytest

import _peer_refs as ref
from _torch_cases import DEVICES, assert_same_bits, torch
from moe_numba import moe_permute, moe_unpermute

DTYPES = [torch.float32, torch.float16, torch.bfloat16]  # TE's _te_dtypes
ALIGN = 16  # TE's align_size
# The probability gradient's dot products are float32 sums of exact products (of 16-bit
# data; rounded ones of float32 data) in the contract's fixed order, whatever the data dtype:
# TE's float32 tolerance. (TE itself checks it with the data dtype's.)
PROB_GRAD_TOLERANCE = torch.float32


@dataclass(frozen=True)
class Grid:
    """One shape of the grid.

    ``topk``: the index map's K; the mask map routes ``pairs`` (default T * K) pairs.
    ``drop``: ``override_buffer_size`` below the rows needed (alignment 1). ``counted``: the
    capacities come from the routing map (``override_buffer_size`` = the rows needed).
    ``cut``: each expert's capacity is its count minus ``cut`` (at least 0).
    """

    routing: str  # "index" or "mask"
    num_tokens: int
    num_experts: int
    hidden: int
    topk: int
    pairs: int | None = None
    drop: int | None = None
    alignment: int = 1
    counted: bool = False
    cut: int = 0

    @property
    def name(self):
        parts = [self.routing, f"T{self.num_tokens}", f"E{self.num_experts}"]
        parts += [f"H{self.hidden}", f"K{self.topk}"]
        if self.pairs is not None:
            parts.append(f"pairs{self.pairs}")
        if self.drop is not None:
            parts.append(f"drop{self.drop}")
        if self.alignment != 1:
            parts.append(f"A{self.alignment}" + ("-counted" if self.counted else "-list"))
        if self.cut:
            parts.append(f"cut{self.cut}")
        return "-".join(parts)

    @property
    def validate(self):
        # dropping rows or tokens past a capacity is a validate=False rule (docs/contract.rst)
        return self.drop is None and not self.cut


# TE: test_permutation_index_map, T = 4096, num_out_tokens in {None, 2039}; here T = 16 and
# 7 rows kept (about the same share of T).
INDEX = [Grid("index", 16, e, 4096, k, drop=d) for e in (7, 16) for k in (2, 5) for d in (None, 7)]
# TE: test_permutation_mask_map (num_out_tokens = routed pairs, None meaning T * K)
MASK = [Grid("mask", 16, e, 4096, k, pairs=p) for e in (7, 16) for k in (2, 5) for p in (None, 7)]
# TE: test_permutation_*_empty_input (T = 0, E = 8, H = 4096, K = 2)
EMPTY = [
    Grid("index", 0, 8, 4096, 2),
    Grid("mask", 0, 8, 4096, 2),
    Grid("mask", 0, 8, 4096, 2, alignment=ALIGN),
    Grid("mask", 0, 8, 4096, 2, alignment=ALIGN, counted=True),
]
# TE: test_permutation_and_padding_mask_map / _with_merging_probs, T = 4096; here T shrinks
# as E and H grow (with alignment 16 the rows grow with the experts hit, not the tokens)
PADDED_SHAPES = ((32, 8, 1280, 2), (16, 64, 4096, 6), (8, 256, 7168, 6), (8, 512, 9216, 8))
PADDED = [
    Grid("mask", t, e, h, k, alignment=ALIGN, counted=c)
    for t, e, h, k in PADDED_SHAPES
    for c in (False, True)
]
# TE's largest padded shape (E = 512, H = 9216, K = 8) as an index map too: more tokens
LARGE = [Grid("index", 16, 512, 9216, 8), Grid("index", 16, 512, 9216, 8, drop=63)]
# TE: test_permutation_{index,mask}_map_topk1_no_probs
TOPK1 = [Grid(r, 16, e, 4096, 1) for r in ("index", "mask") for e in (7, 16)]
# TE: test_permutation_mask_map_capacity_drop (T = 64, E = 8, H = 128, half the pairs routed,
# 17 rows fewer than routed); then per-expert capacities below the counts
CAPACITY = [
    Grid("mask", 64, 8, 128, 4, drop=256 - 17),
    Grid("mask", 64, 8, 128, 4, cut=3),
    Grid("mask", 64, 8, 128, 4, cut=3, alignment=ALIGN),
]
# the shapes whose [R, H] buffers pass a million elements: bfloat16 (TE's training dtype)
# always, the other dtypes with the slow cases
HEAVY = PADDED[2:] + LARGE
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _cases(grids, dtypes=DTYPES):
    """``(grid, dtype)`` parameters; the heavy shapes' non-bfloat16 ones marked slow."""
    return [
        pytest.param(
            g,
            dtype,
            id=f"{g.name}-{_DTYPE_NAMES[dtype]}",
            marks=[pytest.mark.slow] if g in HEAVY and dtype != torch.bfloat16 else [],
        )
        for g in grids
        for dtype in dtypes
    ]


CASES = _cases(INDEX + MASK + EMPTY + PADDED + LARGE + TOPK1 + CAPACITY)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The references are small torch ops, for which torch's intra-op thread pool costs more
    than it saves (on a busy machine many times more); the library's CPU backend keeps its
    own threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass
class Case:
    """The CPU inputs of one grid shape and dtype, and the expected layout."""

    grid: Grid
    x: torch.Tensor  # [T, H]
    probs: torch.Tensor  # [T, K] float32
    routemap: torch.Tensor  # [T, K] int32
    capacities: list
    rowmap: torch.Tensor  # expected [T, E] int32
    num_rows: int

    @property
    def maps(self):
        """The expected row map and the routing map."""
        return self.rowmap, self.routemap

    @property
    def dense_probs(self):
        """The routing probabilities as ``[T, E]``."""
        return ref.dense(self.probs, self.routemap, self.grid.num_experts)

    def permute_arguments(self):
        """``(num_experts, tokens_per_expert, padding_alignment)`` and the keywords."""
        g = self.grid
        keywords = dict(validate=g.validate)
        if g.drop is not None or g.counted:
            keywords["override_buffer_size"] = self.num_rows
            return (g.num_experts, None, g.alignment), keywords
        return (g.num_experts, self.capacities, g.alignment), keywords

    def generator(self, salt):
        return torch.Generator().manual_seed(zlib.crc32(f"{self.grid.name}/{salt}".encode()))

    def rand(self, shape, dtype, salt):
        """TE's ``torch.rand`` inputs (uniform in [0, 1)), then cast."""
        return torch.rand(shape, generator=self.generator(salt)).to(dtype)

    def randn(self, shape, dtype, salt):
        """Values of either sign, for inputs that only exact checks read (a sum of mixed
        signs shows a wrong summation order more often than one of [0, 1) values)."""
        return torch.randn(shape, generator=self.generator(salt)).to(dtype)


def make_case(grid, dtype):
    """TE's inputs for ``grid``: the routing, ``torch.rand`` rows of ``dtype``, probabilities
    normalised per token, and the layout the contract gives them."""
    generator = torch.Generator().manual_seed(zlib.crc32(grid.name.encode()))
    t, e, k = grid.num_tokens, grid.num_experts, grid.topk
    if grid.routing == "index":
        routemap = ref.index_routing(generator, t, e, k)
    else:
        routemap = ref.mask_routing(generator, t, e, t * k if grid.pairs is None else grid.pairs)
    x = torch.rand((t, grid.hidden), generator=generator).to(dtype)
    probs = torch.rand(routemap.shape, generator=generator)
    probs = torch.where(routemap >= 0, probs / probs.sum(dim=1, keepdim=True), 0.0)
    mask = ref.routed(routemap, e)
    capacities = (mask.sum(dim=0) - grid.cut).clamp(min=0).tolist()
    rowmap, num_rows = ref.layout(mask, capacities, grid.alignment, grid.drop)
    return Case(grid, x, probs, routemap, capacities, rowmap, num_rows)


def _on(device, *tensors):
    return [t.clone().to(device) for t in tensors]


def _close(actual, expected, dtype):
    """TE's check for a computed result of data dtype ``dtype``."""
    torch.testing.assert_close(
        actual.detach().cpu().float(), expected.float(), **ref.TE_TOLERANCES[dtype]
    )


def _permute(case, x, probs, routemap):
    arguments, keywords = case.permute_arguments()
    return moe_permute(x, None, routemap, probs, *arguments, return_expert_indices=True, **keywords)


def _unpermute(case, rows, rowmap, routemap, row_probs, weighted):
    g = case.grid
    return moe_unpermute(
        rows,
        rowmap,
        routemap,
        row_probs,
        g.num_tokens,
        g.num_experts,
        using_weighted_combine=weighted,
        validate=g.validate,
    )


# ------------------------------------------------------------------------------------------
# the two ops, each forward and backward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("grid", "dtype"), CASES)
def test_permute(grid, dtype, device):
    """Forward: rows, row map, row probabilities and expert indices are the copies of the
    layout. Backward, through autograd, bit for bit: the data gradient is the float32 combine
    of the gradient rows in ascending expert id (padding rows hold random values: they must
    not be read), each slot's probability gradient its row's."""
    case = make_case(grid, dtype)
    r = case.num_rows
    grad_rows = case.randn((r, grid.hidden), dtype, "grad rows")
    grad_row_probs = case.randn((r,), torch.float32, "grad row probs")
    x, probs, routemap, grad_rows_on, grad_row_probs_on = _on(
        device, case.x, case.probs, case.routemap, grad_rows, grad_row_probs
    )
    x.requires_grad_()
    probs.requires_grad_()
    rows, rowmap, row_probs, scale, indices = _permute(case, x, probs, routemap)
    assert rows.device == rowmap.device == x.device
    assert_same_bits(rowmap.cpu(), case.rowmap)
    assert_same_bits(rows.cpu(), ref.permuted(case.x, case.rowmap, r))
    assert_same_bits(row_probs.cpu(), ref.row_values(case.dense_probs, case.rowmap, r))
    experts = torch.arange(grid.num_experts, dtype=torch.int32).expand(grid.num_tokens, -1)
    assert_same_bits(indices.cpu(), ref.row_values(experts, case.rowmap, r, fill=-1))
    assert scale.shape == (0,)

    grad_x, grad_probs = torch.autograd.grad(
        (rows, row_probs), (x, probs), (grad_rows_on, grad_row_probs_on)
    )
    assert_same_bits(grad_x.cpu(), ref.combine(grad_rows, case.rowmap))
    assert_same_bits(grad_probs.cpu(), ref.slot_values(grad_row_probs, case.rowmap, case.routemap))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("grid", "dtype"), CASES)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_unpermute(grid, dtype, device, weighted):
    """Forward: the combine of every mapped row (padding rows hold random values: they must
    not be read), and the slot probabilities (copies). Backward, from both outputs: the row
    gradient bit for bit (copies, or one float32 product); the probability gradient is the
    slot gradients (bit for bit unweighted), plus the dot products (weighted)."""
    case = make_case(grid, dtype)
    r, t = case.num_rows, grid.num_tokens
    rows_in = case.rand((r, grid.hidden), dtype, "rows")
    row_probs = case.rand((r,), torch.float32, "row probs")
    grad_out = case.rand((t, grid.hidden), dtype, "grad out")
    grad_slots = case.rand(case.routemap.shape, torch.float32, "grad slots")
    rows_on, rowmap, routemap, row_probs_on, grad_out_on, grad_slots_on = _on(
        device, rows_in, case.rowmap, case.routemap, row_probs, grad_out, grad_slots
    )
    rows_on.requires_grad_()
    row_probs_on.requires_grad_()
    out, slot_probs = _unpermute(case, rows_on, rowmap, routemap, row_probs_on, weighted)
    assert_same_bits(slot_probs.detach().cpu(), ref.slot_values(row_probs, *case.maps))
    if weighted:
        _close(out, ref.weighted_combine(rows_in, row_probs, case.rowmap), dtype)
    else:
        assert_same_bits(out.detach().cpu(), ref.combine(rows_in, case.rowmap))

    grad_rows, grad_row_probs = torch.autograd.grad(
        (out, slot_probs), (rows_on, row_probs_on), (grad_out_on, grad_slots_on)
    )
    weights = row_probs if weighted else None
    assert_same_bits(grad_rows.cpu(), ref.spread(grad_out, case.rowmap, r, weights))
    if weighted:
        dots = dict(grad_out=grad_out, rows_in=rows_in)
        expected = ref.row_prob_grad(*case.maps, r, grad_slots=grad_slots, **dots)
        _close(grad_row_probs, expected, PROB_GRAD_TOLERANCE)
    else:
        expected = ref.row_prob_grad(*case.maps, r, grad_slots=grad_slots)
        assert_same_bits(grad_row_probs.cpu(), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("grid", "dtype"), _cases(INDEX[:2] + PADDED[:2] + EMPTY[2:3]))
def test_weighted_unpermute_rows_only(grid, dtype, device):
    """A weighted unpermute whose probabilities need no gradient (autograd then saves no
    rows): the row gradient is still the float32 products, bit for bit."""
    case = make_case(grid, dtype)
    r = case.num_rows
    rows_in = case.rand((r, grid.hidden), dtype, "rows")
    row_probs = case.rand((r,), torch.float32, "row probs")
    grad_out = case.rand((grid.num_tokens, grid.hidden), dtype, "grad out")
    rows_on, rowmap, routemap, row_probs_on, grad_out_on = _on(
        device, rows_in, case.rowmap, case.routemap, row_probs, grad_out
    )
    rows_on.requires_grad_()
    out, _ = _unpermute(case, rows_on, rowmap, routemap, row_probs_on, True)
    (grad_rows,) = torch.autograd.grad(out, rows_on, grad_out_on)
    assert_same_bits(grad_rows.cpu(), ref.spread(grad_out, case.rowmap, r, row_probs))


# ------------------------------------------------------------------------------------------
# TE's end-to-end checks


def _layer(case, device, weighted, expert=None):
    """permute -> ``expert(rows, row_probs)`` (none: the rows as they are) -> unpermute on
    ``device``, then autograd from a random gradient of the combined rows:
    ``(that gradient on the CPU, the combined rows, grad of x, grad of the probabilities)``."""
    g = case.grid
    grad_out = case.rand((g.num_tokens, g.hidden), case.x.dtype, "grad out")
    x, probs, routemap, grad_out_on = _on(device, case.x, case.probs, case.routemap, grad_out)
    x.requires_grad_()
    probs.requires_grad_()
    rows, rowmap, row_probs, _, _ = _permute(case, x, probs, routemap)
    if expert is not None:
        rows = expert(rows, row_probs)
    out, _ = _unpermute(case, rows, rowmap, routemap, row_probs, weighted)
    grad_x, grad_probs = torch.autograd.grad(out, (x, probs), grad_out_on)
    return grad_out, out, grad_x, grad_probs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("grid", "dtype"), CASES)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_round_trip(grid, dtype, device, weighted):
    """permute -> unpermute with the routing probabilities merged (weighted) or not, backward
    from the combined rows: the data gradient is bit for bit the permute's combine of the
    unpermute's row gradient; the probability gradient is the dot products (weighted) or
    zeros."""
    case = make_case(grid, dtype)
    grad_out, out, grad_x, grad_probs = _layer(case, device, weighted)
    r = case.num_rows
    expected_rows = ref.permuted(case.x, case.rowmap, r)
    expected_row_probs = ref.row_values(case.dense_probs, case.rowmap, r)
    if weighted:
        _close(out, ref.weighted_combine(expected_rows, expected_row_probs, case.rowmap), dtype)
    else:
        assert_same_bits(out.detach().cpu(), ref.combine(expected_rows, case.rowmap))
    weights = expected_row_probs if weighted else None
    grad_rows = ref.spread(grad_out, case.rowmap, r, weights)
    assert_same_bits(grad_x.cpu(), ref.combine(grad_rows, case.rowmap))
    if weighted:
        dots = dict(grad_out=grad_out, rows_in=expected_rows)
        grad_row_probs = ref.row_prob_grad(*case.maps, r, **dots)
        expected = ref.slot_values(grad_row_probs, *case.maps)
        _close(grad_probs, expected, PROB_GRAD_TOLERANCE)
    else:
        assert_same_bits(grad_probs.cpu(), torch.zeros_like(case.probs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("grid", "dtype"), _cases(MASK + EMPTY[1:2]))
def test_probabilities_inside_the_expert(grid, dtype, device):
    """TE's mask map alongside probs: the expert scales its rows by the permute's row
    probabilities and an unweighted unpermute combines them. Forward and both gradients
    against the same computation made of index_select / index_add on the routed pairs in
    float32 (TE's tolerances: the reference rounds to the data dtype nowhere)."""
    case = make_case(grid, dtype)

    def expert(rows, row_probs):
        return (rows.float() * row_probs[:, None]).to(dtype)

    grad_out, out, grad_x, grad_probs = _layer(case, device, False, expert)

    x_ref = case.x.float().requires_grad_()
    probs_ref = case.probs.clone().requires_grad_()
    tokens, experts, _ = ref.pairs(case.rowmap)
    pair_probs = ref.dense(probs_ref, case.routemap, grid.num_experts)[tokens, experts]
    expert_ref = x_ref.index_select(0, tokens) * pair_probs[:, None]
    out_ref = x_ref.new_zeros(x_ref.shape).index_add(0, tokens, expert_ref)
    grad_x_ref, grad_probs_ref = torch.autograd.grad(out_ref, (x_ref, probs_ref), grad_out.float())
    _close(out, out_ref, dtype)
    _close(grad_x, grad_x_ref, dtype)
    _close(grad_probs, grad_probs_ref, dtype)


# ------------------------------------------------------------------------------------------
# TE's float8 permutation: bit copies of the rows and of their scales


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("ue8m0", [False, True], ids=["block-scales", "ue8m0-scales"])
@pytest.mark.parametrize("grid", MASK + PADDED[:2], ids=lambda g: g.name)
def test_float8_permute(grid, dtype, ue8m0, device):
    """TE's float8 permutation (mask map; here padded too): float8 rows with TE's 1x128 block
    scales (float32, ``[T, H / 128]``) or UE8M0 scales (four exponents packed per int32 word,
    ``[T, ceil(H / 512)]``): rows and scale rows are copied bit for bit, padding rows zero,
    and the routing probabilities still get their gradient."""
    case = make_case(grid, torch.float32)
    x = case.x.to(dtype)
    blocks = grid.hidden // 128
    if ue8m0:
        generator = case.generator("scale")
        scale = torch.randint(
            -(2**31),
            2**31 - 1,
            (grid.num_tokens, -(-blocks // 4)),
            generator=generator,
            dtype=torch.int32,
        )
    else:
        scale = case.rand((grid.num_tokens, blocks), torch.float32, "scale")
    x_on, scale_on, probs, routemap = _on(device, x, scale, case.probs, case.routemap)
    probs.requires_grad_()
    arguments, keywords = case.permute_arguments()
    rows, rowmap, row_probs, scale_rows = moe_permute(
        x_on, scale_on, routemap, probs, *arguments, using_ue8m0_scale=ue8m0, **keywords
    )
    r = case.num_rows
    assert_same_bits(rowmap.cpu(), case.rowmap)
    assert_same_bits(
        rows.cpu().view(torch.uint8), ref.permuted(x.view(torch.uint8), case.rowmap, r)
    )
    assert_same_bits(scale_rows.cpu(), ref.permuted(scale, case.rowmap, r))
    grad_row_probs = case.rand((r,), torch.float32, "grad row probs")
    (grad_probs,) = torch.autograd.grad(row_probs, probs, grad_row_probs.to(device))
    assert_same_bits(grad_probs.cpu(), ref.slot_values(grad_row_probs, *case.maps))
