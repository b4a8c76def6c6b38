"""What meshconf computes from a validated config: topology warnings, plans, pictures, conversions.

Layer 4. May import ``meshconf.core``, ``meshconf.model`` and ``meshconf.sources``; never
torch, the command line or the runtime. Each feature is a module or package of its own.
"""
