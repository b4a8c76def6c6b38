"""Planning: what a layout costs and where its groups sit, and which layout to choose.

- :mod:`.topology`: which nodes each dim's groups span, and the warnings ``show``,
  ``validate`` and the runtime give for a layout that wastes the links inside a node.
- :mod:`.locality`: the same question for many assignments at once, without a config each.
- :mod:`.merge`, :mod:`.request`, :mod:`.assignments`, :mod:`.ranking`: ``meshconf plan``,
  from the request (the options over a config over a GPU preset) and its checks, through
  every valid assignment of the world factors, to the ranked table and the config of one
  row.
- :mod:`.estimate`: memory, communication and step time of a layout for a model.

A new placement level or a new term of the estimate lands here.
"""
