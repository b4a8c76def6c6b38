"""What meshconf computes from a validated config: placement and plans (:mod:`.plan`), pictures
(:mod:`.render`), conversions from other tools (:mod:`.convert`).

Layer 4. May import ``meshconf.core``, ``meshconf.model``, ``meshconf.trainers`` and
``meshconf.sources``; never torch, the command line or the runtime. Each feature is a module
or package of its own.
"""
