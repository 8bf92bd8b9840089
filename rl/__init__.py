"""Reinforcement-learning placers: REINFORCE with the compiled simulator as the reward.

Importing this package is light (no TensorFlow); TF loads when a policy is built.

- :mod:`placetool.rl.features`  numpy featurisation of colocation groups, coarsening to super-groups
- :mod:`placetool.rl.policies`  ``seq2seq`` (ColocRL), ``hierarchical`` (grouper + placer), ``gdp``
- :mod:`placetool.rl.trainer`   REINFORCE: K samples per step, EMA baseline, entropy bonus, Adam
- :mod:`placetool.rl.method`    ``placetool search --method rl`` (registered as "rl")
- :mod:`placetool.rl.env`       the placement problem as a ``gymnasium.Env``
"""
