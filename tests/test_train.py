"""gmlib.train: the sweep of training runs over (prompt length, seed), vmapped and sharded across devices.

The sweep is checked against each run alone (a gmlib.optimize run on masked prompts, the
pattern of chapter 7), its grid indexing against hand-built expectations, its result on 4
simulated CPU devices against one device (a subprocess: the device count is fixed when jax
starts), and its input validation.
"""

import inspect
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gmlib
from gmlib import denoise, train

ROOT = pathlib.Path(__file__).resolve().parents[1]
L_MAX, BATCH, DIM = 16, 4, 2
A = jnp.array([[1.0, -0.5], [0.3, 0.8]])
HEADS0 = gmlib.init_heads(key=jax.random.key(0), n_heads=2, dim=DIM, out_dim=DIM, scale=0.5)


def _draw(length, key):
    """Prompts of L_MAX N(0, I) tokens of which the first `length` count; target A q."""
    kt, kq = jax.random.split(key)
    prompt = jax.random.normal(kt, (BATCH, L_MAX, DIM))
    queries = jax.random.normal(kq, (BATCH, 3, DIM))
    return gmlib.Batch(prompt, queries, queries @ A.T, mask=jnp.arange(L_MAX) < length)


def _loss(heads, batch):
    pred = jax.vmap(lambda p, q: gmlib.apply_heads(heads, p, q, mask=batch.mask))(batch.prompt, batch.queries)
    return jnp.mean((pred - batch.targets) ** 2)


def _run(key, length, heads0=HEADS0):
    """One training run (chapter 7's pattern): Adam on fresh masked prompts, the length as traced data."""
    return gmlib.optimize(_loss, heads0, optax.adam(1e-2), n_steps=6, record_every=2,
                          sample=jax.tree_util.Partial(_draw, length), key=key)


def test_sweep_equals_each_run_alone():
    """Every grid cell (length, seed) equals the run of that length and seed called on its own; the lengths
    change the runs (the mask is applied) and so do the seeds."""
    lengths, seeds = [4, 9, 16], [0, 7]
    out = train.sweep(_run, seeds=seeds, lengths=lengths)
    assert isinstance(out, gmlib.TrainResult)
    assert out.params.U.shape == (3, 2, 2, DIM, DIM) and out.metric.shape == (3, 2, 3)
    np.testing.assert_array_equal(out.steps, np.broadcast_to([2, 4, 6], (3, 2, 3)))
    alone = jax.jit(_run)
    for i, L in enumerate(lengths):
        for j, s in enumerate(seeds):
            ref = alone(jax.random.key(s), jnp.int32(L))
            np.testing.assert_allclose(out.metric[i, j], ref.metric, rtol=1e-10)
            for a, b in zip(jax.tree.leaves(out.params), jax.tree.leaves(ref.params)):
                np.testing.assert_allclose(a[i, j], b, rtol=1e-10, atol=1e-13)
    first = np.asarray(out.metric[:, :, 0])
    assert len({round(float(v), 10) for v in first.ravel()}) == 6


def test_sweep_grid_indexing_keys_and_inputs():
    """out[i, j] is the run of lengths[i] and seeds[j]: key(seeds[j]) shared across lengths with 1-D seeds,
    key(seeds[i, j]) with 2-D seeds; input rows j; without lengths, a first axis of n_seeds."""
    def probe(key, length, x, tree):
        return {"u": jax.random.uniform(key), "length": length, "x": x, "b": tree["b"]}

    uniform = lambda s: float(jax.random.uniform(jax.random.key(s)))  # noqa: E731
    x, b = jnp.array([10.0, 20.0]), jnp.arange(6.0).reshape(2, 3)
    out = train.sweep(probe, seeds=[3, 2**32 - 1], lengths=[1, 5, 2], inputs=(x, {"b": b}))
    np.testing.assert_array_equal(out["length"], [[1, 1], [5, 5], [2, 2]])
    np.testing.assert_array_equal(out["u"], [[uniform(3), uniform(2**32 - 1)]] * 3)
    np.testing.assert_array_equal(out["x"], [[10.0, 20.0]] * 3)
    np.testing.assert_array_equal(out["b"], np.broadcast_to(b, (3, 2, 3)))
    seeds = np.array([[1, 2], [3, 4], [5, 6]])
    out = train.sweep(probe, seeds=seeds, lengths=[1, 5, 2], inputs=(x, {"b": b}))
    np.testing.assert_array_equal(out["u"], np.vectorize(uniform)(seeds))
    plain = train.sweep(lambda key: jax.random.uniform(key, (2,)), seeds=range(3))
    assert plain.shape == (3, 2)
    np.testing.assert_array_equal(plain[1], jax.random.uniform(jax.random.key(1), (2,)))

    class Unhashable:  # compiled in a jit of its own
        __hash__ = None

        def __call__(self, key, length):
            return length, jax.random.uniform(key)

    lengths, u = train.sweep(Unhashable(), seeds=[3], lengths=[1, 2])
    np.testing.assert_array_equal(lengths, [[1], [2]])
    np.testing.assert_array_equal(u, [[uniform(3)], [uniform(3)]])


def test_sweep_inputs_start_points():
    """Per-seed start points through `inputs`: each cell equals the run from its seed's start point."""
    starts = [gmlib.init_heads(key=jax.random.key(s), n_heads=2, dim=DIM, out_dim=DIM, scale=0.5) for s in (5, 6)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *starts)
    out = train.sweep(_run, seeds=[0, 1], lengths=[8], inputs=(stacked,))
    for j in range(2):
        ref = jax.jit(_run)(jax.random.key(j), jnp.int32(8), starts[j])
        np.testing.assert_allclose(out.metric[0, j], ref.metric, rtol=1e-10)


SWEEP_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, "tests")
    from test_train import _run
    from gmlib import train

    out = train.sweep(_run, seeds=[0, 1], lengths=[16, 8, 4])
    res = {"n_devices": jax.device_count(), "metric": out.metric.tolist(), "U": out.params.U.tolist()}
    if jax.device_count() == 4:  # 6 runs over 3 devices: no padding
        three = train.sweep(_run, seeds=[0, 1], lengths=[16, 8, 4], devices=jax.devices()[:3])
        res["metric_3"] = three.metric.tolist()
    print(json.dumps(res))
    """
)


def _sweep_in_subprocess(n_devices):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={n_devices}",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    res = subprocess.run([sys.executable, "-c", SWEEP_SCRIPT], env=env, capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_sweep_does_not_depend_on_the_number_of_devices():
    """3 lengths x 2 seeds over 4 simulated CPU devices (padded to 8), and over 3 of them, give the
    single-device result."""
    four, one = _sweep_in_subprocess(4), _sweep_in_subprocess(1)
    assert four["n_devices"] == 4 and one["n_devices"] == 1
    np.testing.assert_allclose(four["metric"], one["metric"], rtol=1e-10)
    np.testing.assert_allclose(four["metric_3"], one["metric"], rtol=1e-10)
    np.testing.assert_allclose(four["U"], one["U"], rtol=1e-10, atol=1e-13)
    assert np.asarray(one["metric"]).shape == (3, 2, 3)


def test_sweep_signature():
    """Everything but the function is keyword-only (seeds and sizes are keyword-only in gmlib)."""
    params = inspect.signature(train.sweep).parameters
    assert [p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY] == \
        ["seeds", "lengths", "inputs", "devices"]
    with pytest.raises(TypeError):
        train.sweep(_run, [0])


def _probe(key, length=None):
    return jax.random.uniform(key)


BAD = [
    (dict(fn=None), "fn"),
    (dict(seeds=[]), "seeds"),
    (dict(seeds=[1.5, 2.0]), "seeds"),
    (dict(seeds=[True, False]), "seeds"),
    (dict(seeds=["a"]), "seeds"),
    (dict(seeds=None), "seeds"),
    (dict(seeds=3), "seeds"),
    (dict(seeds=[-1, 2]), "seeds"),
    (dict(seeds=[2**32]), "seeds"),
    (dict(seeds=[[1, 2], [3]]), "seeds"),
    (dict(seeds=[[1, 2]]), "seeds"),  # 2-D seeds without lengths
    (dict(seeds=[[1, 2]], lengths=[4, 8]), "seeds"),  # 1 row for 2 lengths
    (dict(seeds=np.zeros((2, 2, 1), int), lengths=[4, 8]), "seeds"),
    (dict(lengths=[]), "lengths"),
    (dict(lengths=[0, 4]), "lengths"),
    (dict(lengths=[4.0]), "lengths"),
    (dict(lengths=[[4]]), "lengths"),
    (dict(lengths=8), "lengths"),
    (dict(inputs=jnp.zeros(2)), "inputs"),
    (dict(inputs=(jnp.zeros(3),)), "inputs"),
    (dict(inputs=(jnp.zeros(()),)), "inputs"),
    (dict(inputs=({"a": jnp.zeros(2), "b": jnp.zeros((1, 2))},)), "inputs"),
    (dict(devices=[]), "devices"),
]


@pytest.mark.parametrize("bad, name", BAD)
def test_sweep_rejects_invalid(bad, name):
    kw = {"fn": _probe, "seeds": [0, 1], **bad}
    with pytest.raises(ValueError, match=f"`{name}`"):
        train.sweep(kw.pop("fn"), **kw)


def test_schedule_warms_up_decays_and_stays():
    """train.schedule: 0 at step 0, the peak at 5 %, cosine down to `final` at 80 %, then `final`."""
    from gmlib import train

    lr = train.schedule(n_steps=2000, peak=2e-2, final=2e-4)
    rate = lambda t: float(lr(t))  # noqa: E731
    assert rate(0) == 0 and rate(50) == pytest.approx(1e-2) and rate(100) == pytest.approx(2e-2)
    middle = 100 + (1600 - 100) // 2  # halfway down the cosine: the mean of peak and final
    assert rate(middle) == pytest.approx((2e-2 + 2e-4) / 2, rel=1e-3)
    assert rate(1600) == pytest.approx(2e-4) and rate(1999) == pytest.approx(2e-4)
    assert np.all(np.diff([rate(t) for t in range(100, 1600, 50)]) < 0)
    for kwargs, name in ((dict(n_steps=10), "n_steps"), (dict(n_steps=100.0), "n_steps"),
                         (dict(n_steps=100, peak=0.0), "peak"), (dict(n_steps=100, final=np.nan), "final")):
        with pytest.raises(ValueError, match=f"`{name}`"):
            train.schedule(**kwargs)


def test_side_by_side_equals_optimize_alone():
    """A run of side_by_side is gmlib.optimize on its model's loss with the sampler's masked prompts (run by hand)."""
    sampler = denoise.task_sampler(1.0, 1.0, 2, n_queries=2)
    start = gmlib.init_heads(key=jax.random.key(0), n_heads=2, dim=2, out_dim=2, residual=True, scale=0.5)

    def loss(pred, batch):
        return jnp.mean((pred - batch.targets) ** 2)

    out = train.side_by_side({"m": ("softmax", start)}, lambda k, L: sampler(k, 4, L), loss,
                             optimizer=optax.adam(1e-2), lengths=[5, 9], seeds=[[1], [2]], init_seeds=[0],
                             n_steps=10)
    for i, L in enumerate([5, 9]):
        mask = jnp.arange(9) < L

        def by_hand(h, b):
            pred = jax.vmap(lambda p, q: gmlib.apply_heads(h["m"], p, q, mask=b.mask))(b.prompt, b.queries)
            return loss(pred, b)

        ref = gmlib.optimize(by_hand, {"m": start}, optax.adam(1e-2), n_steps=10, key=jax.random.key(i + 1),
                             sample=lambda k: sampler(k, 4, 9)._replace(mask=mask))
        np.testing.assert_allclose(out.params["m"].U[i, 0], ref.params["m"].U, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("models, kw, name", [
    ({}, {}, "models"), ({"m": ("cubic", None)}, {}, "models"), ({"m": "softmax"}, {}, "models"),
    ({"m": ("softmax", "random")}, {"n_records": 3}, "n_records"),
    ({"m": ("softmax", "random")}, {}, "random"),
])
def test_side_by_side_rejects_invalid(models, kw, name):
    with pytest.raises(ValueError, match=name):
        train.side_by_side(models, lambda k, L: None, lambda p, b: 0.0, optimizer=optax.sgd(0.1), lengths=[4],
                           seeds=[0], init_seeds=[0], n_steps=10, **kw)
