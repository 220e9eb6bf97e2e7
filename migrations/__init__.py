"""The migration steps, one module per release hop (installed as ``ckpt_migrate.migrations``).

Each module upgrades a checkpoint by exactly one release, ``SOURCE`` → ``TARGET``, and is named so
that the modules sort in release order and say the hop: ``v01_1_7_to_1_8``, ``v02_1_8_to_1_9``,
…, ``v13_2_9_to_2_10``. Modelled on PyTorch Lightning's ``utilities/migration/migration.py``:
every change is a small, documented function, and every fact names where it was learned.

A hop module declares, at module level:

``SOURCE``, ``TARGET``
    Release names as in :mod:`format.releases` (``"1.9"``, ``"2.0"``), always consecutive.
``FORMAT``
    ``(from, to)`` on-disk format versions when the hop changes the format (0.1 → 0.2 → 0.3 →
    0.4 at 1.7 → 2.0, 0.4 → 0.5 at 2.4 → 2.5); absent or ``None`` otherwise.
``CHANGES``
    Short strings saying what the target release's *writer* changes on disk (type tags, version
    attributes, the JSON re-encoding). They need no tree edit: the writer of the target release
    encodes them. An empty tuple means "no change: only the release advances".
``OPERATIONS``
    A tuple of functions ``op(ctx: StepContext) -> None``, run in order, each editing the neutral
    tree in ``ctx.root`` (:mod:`ckpt_migrate.format.tree`) and reporting every change through
    ``ctx.changed`` / ``ctx.warn``. Each has a docstring whose first line says what it does and
    whose body says which release changed what, and the source of that fact.
``INPUTS``
    :class:`ckpt_migrate.hops.hop.InputSpec` entries for extra inputs a hop can use (the 1.9
    dataloader side files), usually ``()``.
``CONFIG_OPERATIONS``
    A tuple of functions ``op(ctx: ckpt_migrate.config.upgrade.ConfigContext) -> None`` that
    upgrade a run's ``params.yaml`` by this hop (``upgrade --config``): each edits the ruamel
    round-trip document in ``ctx.data`` and reports every change through ``ctx`` (changed,
    moved, added, removed, unknown, note). Documented like ``OPERATIONS``.

The module docstring's first line is the hop's one-line summary (``"1.9 → 2.0: format 0.3 → 0.4;
…"``); its body records what that release changed in the checkpoint container, the sources, and
which content changes (model keys, config, optimizer/scheduler/dataloader state) other steps
handle. Those steps are added to the same module's ``OPERATIONS``.

The graph is discovered and validated at load time by :mod:`ckpt_migrate.hops.graph`
(``graph.load()``): one step per hop, no cycle, no gap between known releases and exactly one
newest release. A broken graph raises ``GraphError`` naming the offending modules. Modules whose
name starts with ``_`` are helpers and are not read as hops.
"""
