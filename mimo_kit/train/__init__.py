"""The RL run of chapters 4–7: the trainer and everything it plays against (Report §4, §5, §6.1, §7).

:mod:`mimo_kit.rl` holds the maths as pure functions; this package puts them to work on a policy, a world and the
rollout machinery of :mod:`mimo_kit.infra`.

| file | idea |
|---|---|
| ``config`` | ``RLConfig``: every switch of the RL recipe, and its presets (Report §5) |
| ``collection`` | a step's batch: rollouts, advantages, GRS/GAR routing, dynamic sampling, the Mixer (§4.1, §4.3, §6) |
| ``update`` | mini-batches, the learner's forward, the PPO-clip loss and step (§5, §6.1) |
| ``engines`` | the rollout engines: building them, weight sync, the harness pool, speculative rollouts (§6) |
| ``run`` | ``run_rl``: SFT warm start, resume, the step loop, evaluation, metrics |
| ``sft`` | the tiny policy and its SFT warm start on the scripted expert |
| ``student`` | a transformers student as the trainer's policy, optional LoRA |
| ``toy`` | the worlds: the toy world (``toy.world``), the repo world (``toy.repo``), pool tenants (``toy.pooled``) |
| ``multi_harness`` | SFT → RL over seeds on the repo world, the per-harness table |
| ``consistency`` | the same rollouts under QDQ × R3 × top-p replay: the train–inference gap |
| ``pool_measure`` | the harness pool and the porter measured on toy episodes |
| ``mopd`` | MOPD² end to end on the toy world: domains, routed teachers, standard and prefix-conditioned OPD |
| ``mopd_experiment`` | the ``mopd2`` experiment: SFT-only vs mixed RL vs MOPD² over seeds, and its claim check |
| ``trl_grpo`` | ``KitGRPOTrainer``: TRL's GRPOTrainer with the kit's advantages (imports TRL) |
| ``experiments`` | ``rl``, chapter 5a's four ``rl-*`` ablations over seeds, ``rl-multi-harness``, ``consistency`` |

Nothing is imported here: each module is imported where it is used (the run imports torch, ``trl_grpo`` TRL).
"""
