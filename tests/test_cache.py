"""The content-addressed cache of trained artefacts (mimo_kit.cache) and the SFT warm start that uses it."""

import pytest
import torch

from mimo_kit import cache


@pytest.fixture
def cache_at(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_address_is_the_content_key(cache_at):
    a = cache.path_for("sft", {"seed": 0, "sft": {"steps": 30, "lr": 1e-3}})
    assert a == cache.path_for("sft", {"sft": {"lr": 1e-3, "steps": 30}, "seed": 0})  # key order does not matter
    assert a.parent == cache_at / "sft" and a.suffix == ".pt"
    others = [cache.path_for("sft", {"seed": 1, "sft": {"steps": 30, "lr": 1e-3}}),
              cache.path_for("sft", {"seed": 0, "sft": {"steps": 31, "lr": 1e-3}}),
              cache.path_for("drafter", {"seed": 0, "sft": {"steps": 30, "lr": 1e-3}})]
    assert len({a, *others}) == 4


def test_store_then_lookup_round_trips_and_absent_or_broken_is_none(cache_at):
    key = {"seed": 3}
    assert cache.lookup("sft", key) is None
    obj = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "losses": [2.0, 1.5]}
    path = cache.store("sft", key, obj)
    back = cache.lookup("sft", key)
    assert back["losses"] == obj["losses"] and torch.equal(back["model"]["w"], obj["model"]["w"])
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    path.write_bytes(b"not a torch file")
    assert cache.lookup("sft", key) is None


def test_unset_means_the_users_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache.cache_root() == tmp_path / ".cache" / "mimo_kit"
    assert cache.path_for("sft", {}).parent == tmp_path / ".cache" / "mimo_kit" / "sft"


def test_a_key_that_is_not_json_is_refused(cache_at):
    with pytest.raises(TypeError, match="'sft'.*JSON"):
        cache.path_for("sft", {"dtype": torch.float32})


def test_any_source_edit_changes_every_address(cache_at, tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    monkeypatch.setattr(cache, "PACKAGE_DIR", pkg)
    cache.code_fingerprint.cache_clear()
    try:
        before = cache.path_for("sft", {"seed": 0})
        (pkg / "sub" / "b.py").write_text("y = 3\n")
        cache.code_fingerprint.cache_clear()
        assert cache.path_for("sft", {"seed": 0}) != before
    finally:
        cache.code_fingerprint.cache_clear()


@pytest.mark.slow
@pytest.mark.outcome
def test_a_second_run_loads_the_warm_start_another_run_trained(cache_at, tmp_path, monkeypatch):
    """Two RL runs of one config in two folders: the second loads the first's SFT from the cache (no training)
    and starts from the same weights; a changed SFT config trains again."""
    from mimo_kit.train import run
    from mimo_kit.train.config import RLConfig
    from mimo_kit.train.run import warm_start

    cfg = RLConfig.preset("toy", sft={"steps": 3, "tasks": 40}, progress=False)
    world = cfg.make_world()
    for name in "abc":
        (tmp_path / name).mkdir()
    first, losses = warm_start(cfg, tmp_path / "a", world)
    assert len(list((cache_at / "sft").iterdir())) == 1

    def no_training(*a, **k):
        raise AssertionError("the SFT warm start was trained again")

    with monkeypatch.context() as m:
        m.setattr(run, "sft_warm_start", no_training)
        second, losses2 = warm_start(cfg, tmp_path / "b", world)
    assert losses2 == losses and (tmp_path / "b" / "sft.pt").is_file()
    assert all(torch.equal(v, second.state_dict()[k]) for k, v in first.state_dict().items())
    with pytest.raises(AssertionError, match="trained again"):
        with monkeypatch.context() as m:
            m.setattr(run, "sft_warm_start", no_training)
            warm_start(cfg.override({"sft.steps": 4}), tmp_path / "c", world)
