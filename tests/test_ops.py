"""HAL ops against the float64 golden, on `cpu` natively, with one emulated run proving each chip binds.

The golden of a case is the reference kernel on float64 copies of its inputs (hal.ops.golden); the
tolerances are hal.ops.tolerances' table. The chip list is read from the plugin manager when this
module is collected, so vendor plugins added later are covered with no change here. Also checked:
that the reference itself agrees with torch's own ops (so the golden is right), that the checker
fails wrong kernels (so these tests can fail), and that dispatch picks the highest-priority kernel.
"""
from __future__ import annotations

import importlib
import math
import types

import pytest
import torch
import torch.nn.functional as F

import hal
from hal.ops import OP_NAMES, golden, reference
from hal.ops.tolerances import DTYPES as TOL_DTYPES
from hal.ops.tolerances import RULES, UNIT_ROUNDOFF, tolerance

_acc_module = importlib.import_module("hal.core.selection")  # `hal.accelerator` is the function

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _emulated_chips() -> list:
    """Every registered chip, to run emulated, read at collection."""
    try:
        return sorted(hal.get_plugin_manager().chips)
    except hal.HalError as exc:  # a broken plugin must fail loudly, not shrink the matrix
        return [pytest.param(None, id="plugin-load-error", marks=pytest.mark.xfail(reason=str(exc), strict=True))]


def _chip_modes() -> list:
    """cpu natively plus one emulated chip. The emulated chips bind the same torch kernels as cpu
    (test_emulated_chip_binds_and_runs_each_op proves it per chip and sweeps any kernel that differs),
    so repeating every golden test per emulated chip would add nothing."""
    chips = [c for c in _emulated_chips() if isinstance(c, str) and c != "cpu"]
    modes = [pytest.param(("cpu", False), id="cpu-native")]
    if chips:
        modes.append(pytest.param((chips[0], True), id=f"{chips[0]}-emulated"))
    return modes


@pytest.fixture
def restore_hal():
    """Put the plugin manager and the binding back as they were, whatever the test did."""
    pm = _acc_module.get_plugin_manager()
    prev = hal.bound()
    yield
    hal.set_plugin_manager(pm)
    hal.reset()
    if prev is not None:
        _acc_module._BOUND = prev
        hal.ops.bind(prev.kernels)


@pytest.fixture(params=_chip_modes())
def bound_chip(request, restore_hal):
    chip, emulated = request.param
    assert chip is not None, "plugins failed to load"
    return hal.bind(chip, emulated=emulated)


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---- every op x dtype against the golden, through hal.ops on the bound chip ------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
@pytest.mark.parametrize("op", OP_NAMES)
def test_op_matches_golden(bound_chip, op, dtype):
    acc = bound_chip
    kernel = acc.kernels[op]
    results = golden.check_op(getattr(hal.ops, op), op, dtype, kernel.describe(), device=acc.device)
    assert len(results) >= 2
    failures = [r.describe() for r in results if not r.ok]
    tag = "EMULATED" if acc.emulated else "native"
    assert not failures, f"chip {acc.chip.name} ({tag}):\n" + "\n".join(failures)


@pytest.mark.parametrize("chip", _emulated_chips())
def test_emulated_chip_binds_and_runs_each_op(chip, restore_hal):
    """Each chip, emulated, binds a kernel for every op and runs it right through hal.ops (one case
    per op). Where it binds the same kernel as cpu natively, test_op_matches_golden's cpu sweep covers
    it; a kernel of its own gets the full golden sweep here."""
    assert chip is not None, "plugins failed to load"
    hal.reset()
    cpu = {op: k.fn for op, k in hal.bind("cpu").kernels.items()}
    hal.reset()
    acc = hal.bind(chip, emulated=True)
    assert acc.emulated and acc.device.type == "cpu"
    own = []
    for op in OP_NAMES:
        kernel = acc.kernels[op]
        case = golden.cases(op, torch.float32)[0]
        res = golden.check(getattr(hal.ops, op), case, kernel.describe(), device=acc.device)
        assert res.ok, f"{chip} (EMULATED): {res.describe()}"
        if kernel.fn is not cpu[op]:
            own.append(op)
            for dtype in DTYPES:
                failures = [r.describe() for r in golden.check_op(getattr(hal.ops, op), op, dtype, kernel.describe(),
                                                                  device=acc.device) if not r.ok]
                assert not failures, f"{chip} (EMULATED) {op}:\n" + "\n".join(failures)
    assert set(own) <= set(OP_NAMES)


@pytest.mark.parametrize("dtype", DTYPES[:3], ids=_dt)
@pytest.mark.parametrize("op", OP_NAMES)
def test_reference_kernel_matches_golden(op, dtype):
    """The reference kernel in 16/32-bit: what every chip without an override runs."""
    failures = [r.describe() for r in golden.check_op(reference.KERNELS[op], op, dtype, "reference") if not r.ok]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("op", OP_NAMES)
def test_cases_cover_noncontiguous_and_odd_sizes(op):
    """Each op's cases include a non-contiguous input and a size that is not a power of two."""
    noncontig = odd = False
    for case in golden.cases(op, torch.float32):
        args, kwargs = case.build(torch.device("cpu"))
        tensors = [t for a in (*args, *kwargs.values()) for t in (a if isinstance(a, list) else [a])
                   if isinstance(t, torch.Tensor)]
        noncontig |= any(not t.is_contiguous() for t in tensors)
        odd |= any(s > 2 and s & (s - 1) for t in tensors for s in t.shape)
    assert noncontig and odd, f"{op}: noncontig={noncontig} odd={odd}"


# ---- the reference is right: it agrees with torch's own ops (float64) -----------------------
def _r(*shape, scale=1.0, g=None):
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


def test_reference_agrees_with_torch():
    g = torch.Generator().manual_seed(1)
    x, w, b = _r(3, 5, 37, g=g), _r(19, 37, g=g), _r(19, g=g)
    ref = reference
    close = lambda a, e: torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)  # noqa: E731
    close(ref.linear(x, w, b), F.linear(x, w, b))
    close(ref.matmul(x, w.t()), x @ w.t())
    h = _r(37, g=g)
    close(ref.rms_norm(x, h, 1e-6), F.rms_norm(x, (37,), h, 1e-6))
    close(ref.layer_norm(x + 3, h, b[:1].expand(37), 1e-5), F.layer_norm(x + 3, (37,), h, b[:1].expand(37), 1e-5))
    close(ref.layer_norm(x, None, None, 1e-3), F.layer_norm(x, (37,), None, None, 1e-3))
    close(ref.softmax(x, 1), torch.softmax(x, 1))
    close(ref.gelu(x), F.gelu(x))
    close(ref.gelu(x, "tanh"), F.gelu(x, approximate="tanh"))
    close(ref.silu(x), F.silu(x))
    close(ref.swiglu(x[..., :36]), F.silu(x[..., :18]) * x[..., 18:36])
    q, k, v = _r(2, 3, 7, 16, g=g), _r(2, 3, 9, 16, g=g), _r(2, 3, 9, 16, g=g)
    close(ref.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    close(ref.scaled_dot_product_attention(q, k, v, is_causal=True),  # top-left aligned like torch
          F.scaled_dot_product_attention(q, k, v, is_causal=True))
    mask = torch.rand(7, 9, generator=g) < 0.6
    mask[:, 0] = True
    close(ref.scaled_dot_product_attention(q, k, v, attn_mask=mask),
          F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    add = -3 * torch.rand(7, 9, generator=g, dtype=torch.float64)
    close(ref.scaled_dot_product_attention(q, k, v, attn_mask=add, scale=0.3),
          F.scaled_dot_product_attention(q, k, v, attn_mask=add, scale=0.3))
    logits, t = _r(11, 29, g=g), torch.randint(0, 29, (11,), generator=g)
    t[:3] = -100
    for red in ("mean", "sum", "none"):
        close(ref.cross_entropy(logits, t, reduction=red), F.cross_entropy(logits, t, reduction=red))
    ids, table = torch.randint(0, 50, (3, 7), generator=g), _r(50, 8, g=g)
    close(ref.embedding(ids, table), F.embedding(ids, table))


def test_sdpa_fully_masked_row_gives_zeros(restore_hal):
    # The reference (the HAL's definition) gives zeros for a query that may attend to no key, as
    # torch 2.13's CPU kernel does (older torch gave NaN). Every kernel is held to zeros by the
    # golden's fully_masked_row case.
    hal.bind("cpu")
    q, k, v = _r(1, 2, 5, 8).float(), _r(1, 2, 6, 8).float(), _r(1, 2, 6, 8).float()
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[3] = False
    out = hal.ops.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out[..., 3, :], torch.zeros(1, 2, 8))
    assert torch.isfinite(out).all()
    keep = [0, 1, 2, 4]
    torch.testing.assert_close(out[..., keep, :], F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[..., keep, :])


def test_cross_entropy_ignore_index(restore_hal):
    hal.bind("cpu")
    logits, t = _r(9, 6).float(), torch.tensor([0, 3, 1, 3, 5, 2, 3, 4, 1])
    kept = t != 3
    expect = -torch.log_softmax(logits, -1)[kept.nonzero().squeeze(1), t[kept]].mean()
    torch.testing.assert_close(hal.ops.cross_entropy(logits, t, ignore_index=3), expect)
    none = hal.ops.cross_entropy(logits, t, ignore_index=3, reduction="none")
    assert torch.equal(none[~kept], torch.zeros(3))
    assert hal.ops.cross_entropy(logits, torch.full((9,), 3), ignore_index=3).item() == 0.0  # not NaN


def test_gelu_tanh_is_not_erf():
    """The two forms differ by more than the float32 tolerance, so a kernel ignoring `approximate`
    fails the golden (see test_golden_check_catches_wrong_kernel)."""
    x = torch.linspace(-4, 4, 101, dtype=torch.float64)
    diff = (reference.gelu(x, "tanh") - reference.gelu(x)).abs().max().item()
    assert diff > 100 * tolerance("gelu", torch.float32)[1]
    with pytest.raises(ValueError, match="approximate"):
        reference.gelu(x, "sigmoid")


def test_rotary_broadcast_layouts_agree(bound_chip):
    B, S, H, D = 2, 6, 3, 8
    cos, sin = golden.rotary_tables(S, D)
    x = _r(B, S, H, D).float()
    bshd = hal.ops.rotary_embedding(x, cos.reshape(1, S, 1, D).float(), sin.reshape(1, S, 1, D).float())
    bhsd = hal.ops.rotary_embedding(x.transpose(1, 2), cos.float(), sin.float())
    torch.testing.assert_close(bhsd.transpose(1, 2), bshd)
    assert torch.equal(bshd[:, 0], x[:, 0])  # position 0: cos 1, sin 0
    # Position p rotates the pair (x_i, x_{i+D/2}) by angle p * inv_freq_i: norms are kept.
    torch.testing.assert_close(bshd.norm(dim=-1), x.norm(dim=-1))


def test_swiglu_dim(bound_chip):
    x = _r(10, 7).float()
    torch.testing.assert_close(hal.ops.swiglu(x, dim=0), hal.ops.swiglu(x.t().contiguous()).t())
    a, b = x[:5], x[5:]
    torch.testing.assert_close(hal.ops.swiglu(x, dim=0), F.silu(a) * b)
    with pytest.raises(ValueError, match=r"swiglu: dim 0 of shape \(3, 2\) has odd size 3"):
        hal.ops.swiglu(_r(3, 2).float(), dim=0)  # no halves to split


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32, torch.bfloat16), ids=_dt)
def test_adamw_step_matches_torch_optim_adamw(bound_chip, dtype):
    """hal.ops.adamw_step over 4 steps against torch.optim.AdamW run in float64 on the same start,
    within 4 x the one-step tolerance (per-step rounding adds up)."""
    steps, hyper = 4, dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    g = torch.Generator().manual_seed(3)
    start = [_r(7, 13, g=g).to(dtype), _r(37, g=g).to(dtype)]
    grads = [[_r(*p.shape, g=g).to(dtype) for p in start] for _ in range(steps)]
    golden_params = [torch.nn.Parameter(p.double().clone()) for p in start]
    opt = torch.optim.AdamW(golden_params, foreach=False, **hyper)
    params = [p.clone() for p in start]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t in range(1, steps + 1):
        for gp, gr in zip(golden_params, grads[t - 1]):
            gp.grad = gr.double()
        opt.step()
        hal.ops.adamw_step(params, grads[t - 1], m, v, t, hyper["lr"], *hyper["betas"], hyper["eps"],
                           hyper["weight_decay"])
    rtol, atol = tolerance("adamw_step", dtype)
    for p, p0, gp in zip(params, start, golden_params):
        assert p.dtype == dtype and not torch.equal(p, p0)  # it moved
        torch.testing.assert_close(p.double(), gp.detach(), rtol=steps * rtol, atol=steps * atol)
    for st, key in ((m, "exp_avg"), (v, "exp_avg_sq")):
        for s, gp in zip(st, golden_params):
            torch.testing.assert_close(s.double(), opt.state[gp][key], rtol=steps * rtol, atol=steps * atol)


def test_adamw_step_refuses_step_zero():
    p = [torch.zeros(2)]
    with pytest.raises(ValueError, match="step counts from 1"):
        reference.adamw_step(p, p, p, p, 0, 1e-3, 0.9, 0.999, 1e-8, 0.0)


# ---- the checker fails wrong kernels (so the golden tests above can fail) ---------------------
def _f16_foreach_adamw(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay):
    # torch's foreach AdamW does its math in float16: eps and small v underflow, m / 0 = inf.
    torch.optim._functional.adamw(params, grads, exp_avgs, exp_avg_sqs, [],
                                  [torch.tensor(float(step - 1)) for _ in params], foreach=True, amsgrad=False,
                                  beta1=beta1, beta2=beta2, lr=lr, weight_decay=weight_decay, eps=eps,
                                  maximize=False)


def _naive_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
    # softmax over a row of -inf is 0/0 = NaN; the reference turns it into zeros.
    scores = (q @ k.transpose(-2, -1)) * (scale or q.shape[-1] ** -0.5)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def _raises(*args, **kwargs):
    raise RuntimeError("kernel exploded")


WRONG_KERNELS = {
    # name: (op, dtype, kernel, case that must fail, what the failure says)
    "gelu_ignores_tanh": ("gelu", torch.float32, lambda x, approximate="none": F.gelu(x), "tanh", "worst"),
    "sdpa_nan_on_masked_row": ("scaled_dot_product_attention", torch.float32, _naive_sdpa,
                               "fully_masked_row", "non-finite"),
    "sdpa_ignores_causal": ("scaled_dot_product_attention", torch.bfloat16,
                            lambda q, k, v, attn_mask=None, is_causal=False, scale=None:
                            reference.scaled_dot_product_attention(q, k, v, attn_mask, False, scale),
                            "causal", "worst"),
    "torch_cross_entropy_all_ignored": ("cross_entropy", torch.float32,
                                        lambda lg, t, ignore_index=-100, reduction="mean":
                                        F.cross_entropy(lg, t, ignore_index=ignore_index, reduction=reduction),
                                        "all_ignored", "non-finite"),
    "float64_softmax_in_float32": ("softmax", torch.float64,
                                   lambda x, dim=-1: torch.softmax(x.float(), dim).double(), "last", "worst"),
    "bf16_linear_returns_float32": ("linear", torch.bfloat16,
                                    lambda x, w, b=None: F.linear(x.float(), w.float(), None if b is None else b.float()),
                                    "bias", "dtype torch.float32"),
    "fp16_adamw_in_fp16": ("adamw_step", torch.float16, _f16_foreach_adamw, "step1_fresh", "non-finite"),
    "rms_norm_without_weight": ("rms_norm", torch.bfloat16, lambda x, w, eps=1e-6: F.rms_norm(x, x.shape[-1:], None, eps),
                                "basic", "worst"),
    "swiglu_halves_swapped": ("swiglu", torch.float16,
                              lambda x, dim=-1: reference.swiglu(torch.cat(x.chunk(2, dim)[::-1], dim), dim),
                              "last", "worst"),
    "rotary_wrong_sign": ("rotary_embedding", torch.float32,
                          lambda x, c, s: reference.rotary_embedding(x, c, -s), "bshd", "worst"),
    "embedding_off_by_one": ("embedding", torch.float16, lambda ids, w: w[(ids + 1) % w.shape[0]], "basic", "worst"),
    "kernel_raises": ("silu", torch.float32, _raises, "basic", "raised RuntimeError: kernel exploded"),
}


@pytest.mark.parametrize("name", sorted(WRONG_KERNELS))
def test_golden_check_catches_wrong_kernel(name):
    op, dtype, fn, case_name, says = WRONG_KERNELS[name]
    case = next(c for c in golden.cases(op, dtype) if c.name == case_name)
    res = golden.check(fn, case, kernel=name)
    assert not res.ok, res.describe()
    assert says in res.describe(), res.describe()
    assert golden.check(reference.KERNELS[op], case, "reference").ok  # the case itself is fine


# ---- the tolerance table ---------------------------------------------------------------------
def test_tolerance_table_shape_and_order():
    for op in OP_NAMES:
        assert RULES[op].why
        tols = [tolerance(op, d) for d in ("float64", "float32", "float16", "bfloat16")]
        if op == "embedding":
            assert tols == [(0.0, 0.0)] * 4
            continue
        rtols = [t[0] for t in tols]
        assert rtols == sorted(rtols) and len(set(rtols)) == 4, (op, rtols)  # coarser dtype, larger budget
        assert rtols[0] < 1e-13 and rtols[3] < 0.05, (op, rtols)
        assert tolerance(op, torch.bfloat16) == tolerance(op, "bfloat16")
    # Worked example from the docstring: gelu in bf16 = 4 u(bf16) + 8 u(fp32).
    assert tolerance("gelu", torch.bfloat16)[0] == pytest.approx(4 * 2.0 ** -8 + 8 * 2.0 ** -24)
    assert tolerance("softmax", torch.float16)[1] == torch.finfo(torch.float16).tiny
    assert tolerance("matmul", torch.float32)[0] == pytest.approx((2 + 2 * 64) * 2.0 ** -24)
    assert set(TOL_DTYPES) == set(UNIT_ROUNDOFF)


def test_tolerance_errors_name_what_is_wrong():
    with pytest.raises(hal.UnknownOpError, match="'conv2d'.*rms_norm"):
        tolerance("conv2d", torch.float32)
    with pytest.raises(ValueError, match="int32.*float32"):
        tolerance("softmax", torch.int32)


# ---- dispatch: highest priority wins, bound once, refusals name plugin and hook ----------------
def _kernel_plugin(name: str, kernels: dict, chips_for=("cpu",), native_only: bool = False):
    """A third-party plugin that owns no chip and only adds op kernels."""
    ns = types.ModuleType(name)  # hashable, as pluggy needs a plugin object to be

    @hal.hookimpl
    def hal_plugin_info():
        return hal.PluginInfo(name=name, version="1.0", contract_version=hal.CONTRACT_VERSION)

    @hal.hookimpl
    def hal_chips():
        return []

    @hal.hookimpl
    def hal_op_kernels(chip, emulated):
        if chip not in chips_for or (native_only and emulated):
            return None
        return [hal.OpKernel(op, fn, priority=p, name=f"{name}.{op}") for op, (fn, p) in kernels.items()]

    ns.hal_plugin_info, ns.hal_chips, ns.hal_op_kernels = hal_plugin_info, hal_chips, hal_op_kernels
    ns.__name__ = name
    return ns


def _fresh_pm(*plugins) -> hal.PluginManager:
    import hal_cpu
    pm = hal.PluginManager()
    pm.register(hal_cpu, distribution="test")
    for p in plugins:
        pm.register(p)
    return pm


def test_dispatch_picks_highest_priority_kernel(restore_hal):
    calls = []

    def fast_gelu(x, approximate="none"):
        calls.append("fast")
        return reference.gelu(x, approximate)

    def faster_gelu(x, approximate="none"):
        calls.append("faster")
        return reference.gelu(x, approximate)

    def slow_silu(x):
        calls.append("slow_silu")
        return reference.silu(x)

    # Registration order must not matter: "faster" (30) is registered before "fast" (20).
    pm = _fresh_pm(_kernel_plugin("acme_faster", {"gelu": (faster_gelu, 30)}),
                   _kernel_plugin("acme_fast", {"gelu": (fast_gelu, 20), "silu": (slow_silu, 0)}))
    hal.set_plugin_manager(pm)
    hal.reset()
    acc = hal.bind("cpu")
    x = torch.randn(4, 8)
    torch.testing.assert_close(hal.ops.gelu(x), F.gelu(x))
    assert calls == ["faster"]
    assert acc.kernels["gelu"].plugin == "acme_faster" and acc.kernels["gelu"].priority == 30
    assert "acme_faster.gelu" in acc.describe()["kernels"]["gelu"]
    hal.ops.silu(x)  # priority 0 does not beat hal_cpu's torch.silu (priority 1)
    assert calls == ["faster"] and acc.kernels["silu"].plugin == "cpu"
    assert hal.ops.bound_kernels()["gelu"] is acc.kernels["gelu"]


def test_native_only_kernel_is_not_used_emulated(restore_hal):
    calls = []
    plugin = _kernel_plugin("acme_native", {"silu": (lambda x: calls.append(1) or F.silu(x), 50)},
                            native_only=True)
    hal.set_plugin_manager(_fresh_pm(plugin))
    hal.reset()
    hal.bind("cpu", emulated=True)
    hal.ops.silu(torch.ones(3))
    assert calls == []
    hal.bind("cpu")
    hal.ops.silu(torch.ones(3))
    assert calls == [1]


def test_unknown_op_in_kernel_is_refused_naming_plugin_and_hook():
    bad = _kernel_plugin("acme_bad", {"flash_attention_v9": (lambda *a: None, 5)})
    pm = _fresh_pm()
    with pytest.raises(hal.PluginValidationError) as info:
        pm.register(bad)
    err = info.value
    assert err.plugin == "acme_bad" and err.hook == "hal_op_kernels"
    assert "'acme_bad'" in str(err) and "'hal_op_kernels'" in str(err) and "'flash_attention_v9'" in str(err)
    assert "acme_bad" not in pm.plugins


def test_ops_bind_on_first_call(restore_hal, monkeypatch):
    for var in ("HAL_CHIP", "HAL_EMULATE", "HAL_CLUSTER", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    hal.set_plugin_manager(_fresh_pm())
    hal.reset()
    assert hal.bound() is None and hal.ops.bound_kernels() == {}
    out = hal.ops.silu(torch.tensor([1.0]))
    assert out.item() == pytest.approx(1 / (1 + math.exp(-1)))
    assert hal.bound() is not None and hal.bound().chip.name == "cpu"
    assert set(hal.ops.bound_kernels()) == set(OP_NAMES)


# ---- `hal ops-check` ---------------------------------------------------------------------------
def test_ops_check_cli_passes_and_labels_emulated_chips(restore_hal, capsys):
    from hal.cli import main
    hal.set_plugin_manager(_fresh_pm(_kernel_plugin("acme_ok", {"silu": (lambda x: F.silu(x), 9)},
                                                    chips_for=("cpu",))))
    assert main(["ops-check", "--ops", "silu,softmax", "--dtype", "float32,bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "chip cpu (native, plugin cpu)" in out
    assert "acme_ok.silu (plugin acme_ok, priority 9)" in out and "FAIL" not in out
    assert "4 op x dtype checks, 0 failed" in out
    assert hal.bound() is None  # the check leaves no binding behind
    assert main(["ops-check", "--chips", "cpu", "--ops", "gelu", "--dtype", "float64", "--json"]) == 0
    import json
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["chips"][0]["results"][0]["dtype"] == "float64"


def test_ops_check_cli_fails_on_a_wrong_kernel(restore_hal, capsys):
    from hal.cli import main
    from hal.cli.ops_check import run_checks

    class Fake:  # a second chip, emulated by the check; a wrong gelu kernel registered for it
        __name__ = "fakechip"

        @hal.hookimpl
        def hal_plugin_info(self):
            return hal.PluginInfo(name="fakechip", version="0", contract_version=hal.CONTRACT_VERSION)

        @hal.hookimpl
        def hal_chips(self):
            return [hal.ChipSpec(name="fake", vendor="test", torch_device_type="cpu", ccl_backend="gloo")]

        hal_native_available = hal.hookimpl(lambda self, chip: False)
        hal_device_runtime = hal.hookimpl(lambda self, chip: None)
        hal_create_process_group = hal.hookimpl(lambda self, chip, store, rank, world_size, timeout: None)
        hal_collective_capabilities = hal.hookimpl(lambda self, chip: hal.CapabilityMatrix(chip=chip))

        @hal.hookimpl
        def hal_chip_profile(self, chip, model):
            u = hal.unknown
            return hal.ChipProfile(chip=chip, model="fake", peak_flops={}, memory_bytes=u("B"),
                                   memory_bandwidth=u("B/s"), intra_node_bandwidth=u("B/s"), nic_bandwidth=u("B/s"))

    wrong = _kernel_plugin("acme_wrong", {"gelu": (lambda x, approximate="none": F.gelu(x), 9)}, chips_for=("fake",))
    hal.set_plugin_manager(_fresh_pm(Fake(), wrong))
    assert main(["ops-check", "--ops", "gelu", "--dtype", "float32"]) == 1
    out = capsys.readouterr().out
    assert "chip fake (EMULATED, plugin fakechip)" in out and "chip cpu (native" in out
    assert "FAIL   acme_wrong.gelu" in out and "FAIL case tanh" in out
    assert "1 EMULATED: fake" in out and "2 op x dtype checks, 1 failed" in out
    reports = run_checks(["fake"], ["float32"], ["gelu", "silu"])
    assert [r.ok for r in reports[0].rows] == [False, True] and reports[0].emulated
    assert main(["ops-check", "--chips", "tpu"]) == 2
    assert "known chips: ['cpu', 'fake']" in capsys.readouterr().err
