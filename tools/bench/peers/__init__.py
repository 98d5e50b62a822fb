"""Benchmark (``tools/bench/bench_peers.py``): the honest table. epishard's reader beside the loaders users
would pick instead, at the same batch diversity and output dtype, and against the decode limit.

What makes it honest:

- **Batch diversity is a figure of every row**: distinct episodes per batch and the probability that two
  samples of a batch share an episode, measured over the timed batches, next to their exact
  expectation under i.i.d. uniform sampling of the windows the system's policy draws from
  (``epishard.stream.diversity``), and the ratio. The headline compares epishard only where its
  diversity is >= 0.9 of i.i.d. (LeRobot's shuffled sampler is i.i.d. by construction).
- **Windows per episode come from the sampling policy**, never from the run length: ``all`` = every
  anchor every epoch (LeRobot's population: every frame), ``pe4`` = 4 per episode per epoch.
- **Timed regions of at least ``--seconds``** (10) and ``--min-batches`` (5), after ``--warmup`` (2)
  batches; an epoch that ends inside the region is crossed and its start counted.
- **Datasets tiled to >= 200 episodes** (``peers.tile``: copies of the episodes, the video files
  shared by reference), so that a batch of 8 can hold 8 episodes; LeRobot reads the tiled v3.0
  folder, epishard converts it (cached in ``--work`` across runs).
- **Same output dtype**: a uint8 and a float32 headline. LeRobot 0.6.1 in both (``--uint8`` is its
  ``return_uint8=True``, its training default), LeRobot 0.4.4 float32 (all it has).
- **The decode limit** (``peers.decodelimit``): ffmpeg -threads 1 decode-to-RGB frames per CPU second
  x cores / distinct frames a sample needs; each row's samples/s is also stated as a fraction of it.

Same window for every system: per camera 9 frames over a 33-frame span (offsets 0, 4, ..., 32), the
state at the anchor, a 16-step action chunk; windows at the episode's edges are clamped and flagged
(LeRobot's ``delta_timestamps`` padding; epishard ``boundary="pad"``); batch 8, 2 DataLoader
workers (persistent), shuffled. Systems (``config.SYSTEMS``):

``lerobot``, ``lerobot061``, ``lerobot061-u8``   LeRobotDataset 0.4.4 / 0.6.1 on the tiled v3.0 folder,
                 through ``peers/lerobot_harness.py`` run with the release's own venv (built by
                 ``../shared/peers/setup_lerobot_venv.sh`` / ``setup_lerobot061_venv.sh``; 0.6.1 is
                 patched for Python 3.11 there: state it wherever a 0.6.1 figure is quoted).
``raydata-u8``, ``raydata``   Ray Data 2.60's own LeRobot reader, ``ray.data.read_lerobot(root,
                 delta_timestamps=...)`` (the same windows: it applies LeRobot's clamp-and-pad rule),
                 one read task per episode on a local 2-CPU Ray, ``iter_torch_batches`` with a
                 32-row local shuffle buffer (Ray has no sampler over anchors: batches hold few
                 episodes, which the diversity columns show); u8 in Ray's (N, T, H, W, C) layout, f32
                 converted in the read tasks (``peers/raydata.py``; it needs ``lerobot`` >= 0.5
                 beside Ray, so it runs with the 0.6.1 peer's python and this venv's Ray; ``raydata``
                 (f32) on request).
``lance-video``, ``lance-video-u8``, ``lance-jpeg``, ``lance-jpeg-u8``   lerobot-lancedb 0.3.1's
                 ``LanceDBDataset`` (mp4 blobs) / 0.2.2's ``LeRobotLanceDataset`` (one JPEG per frame) on
                 the release's own conversion of the tiled folder (made once, its time and size
                 recorded), through ``peers/lance_harness.py`` in venvs built by
                 ``../shared/peers/setup_lance_venvs.sh`` (after the 0.6.1 peer's); 6 items per copy
                 compared with LeRobot 0.6.1's first (``lance_items_equal_to_lerobot``). On request.
``webdataset``   ``WebDataset(tars, resampled)`` -> ``shuffle(32)`` (episodes) -> one random anchor per
                 episode sample; per camera a fresh torchcodec decoder on the member's bytes,
                 ``get_frames_at`` the window's distinct frames, only those converted (float32 or u8).
``naive``        map-style over every (episode, anchor), shuffled by the DataLoader; per sample the
                 members read by the index's byte offsets, decoded and converted as ``webdataset``.
``es-*``         epishard ``WindowDataset`` + ``WindowLoader``, telemetry on, no resize; ``f32`` /
                 ``u8`` output, ``all`` or ``pe4`` policy; ``es-*-global``: ``shuffle="global"``;
                 ``es-u8-cache256`` / ``-cache128``: a frame cache of that many MiB (the memory knob);
                 ``es-u8-pool16`` / ``-poolall``: a shuffle pool of 16 episodes / of all the
                 worker's episodes (the diversity curve between the default and global).
                 ``--epishard-opt KEY=VALUE`` passes a ``WindowDataset`` keyword or ``WindowSpec``
                 field to every epishard system (feature-detected: keys this epishard lacks are
                 printed and recorded as ignored).

Reported per run (one JSON line each in ``--out``), medians per (dataset, system): samples/s, output
dtype, diversity (measured, i.i.d., ratio), frames decoded per frame returned (epishard telemetry;
webdataset/naive counted alike; LeRobot: expected from the keyframe tables), time to first batch,
peak RSS (all processes), the largest worker's peak RSS, PSS, bytes read per sample, worker seconds
per stage. Every run is its own process (LeRobot's: the harness; ours: forked from a process that
imported torch, torchcodec, ... once, whose PSS is added; ``--fresh-process`` for a fresh interpreter).

Commands (repository root; peers that are not installed are skipped with a line saying how):

    python tools/bench/bench_peers.py                  # the honest table: ~15 min on 2 quiet cores (+ ~10 min
                                                 # the first time: tiling and converting, kept in --work)
    python tools/bench/bench_peers.py --setup-peers    # first build both LeRobot peer venvs (~4 min)
    python tools/bench/bench_peers.py --quick          # smoke run (1 s per run; make test runs it on the sample)
    python tools/bench/bench_peers.py --epishard-opt shuffle=8 --out /tmp/x.jsonl --markdown /tmp/x.md
    python tools/bench/bench_peers.py --rounds 3 --systems lerobot061-u8,es-u8 --datasets unitree_g1_bottle_av1_v30
"""
