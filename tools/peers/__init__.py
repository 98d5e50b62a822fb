"""Benchmark (``tools/bench_peers.py``): epishard's reader beside the loaders users would pick instead.

Same window for every system: per camera 9 frames over a 33-frame span (offsets 0, 4, ..., 32), the
state at the anchor, a 16-step action chunk; windows at the episode's edges are clamped and flagged
(LeRobot's ``delta_timestamps`` padding; epishard ``boundary="pad"``); batch 8, 2 DataLoader
workers (persistent), shuffled, 2 warm-up batches, then timed batches. Systems:

``lerobot``      LeRobotDataset (lerobot 0.4.4) on the v3.0 folder itself, through the harness
                 ``../shared/peers/lerobot_windows.py`` run with the peer venv's python (float32 [0, 1]).
``webdataset``   a plain webdataset pipeline over epishard's shards: ``WebDataset(tars, resampled)``
                 -> ``shuffle(32)`` (episodes) -> per episode one random anchor; per camera a fresh
                 torchcodec ``VideoDecoder`` on the member's bytes (default exact mode: it scans the
                 file), decode the whole 33-frame span, convert every decoded frame to float32 [0, 1],
                 keep 9. (Which frame a row shows comes from the index, a dict lookup; a tar-only user
                 would seek by timestamp, at the same decode cost.)
``naive``        epishard's naive mode over the same shards: a map-style dataset of every (episode,
                 anchor), shuffled by the DataLoader; per sample read the table and video members by
                 the index's byte offsets, a fresh decoder per camera, decode the span, float32 all, keep 9.
``es-*``         epishard: ``WindowDataset`` + ``WindowLoader``, telemetry on, no resize.
    ``es-f32`` / ``es-u8``   float32 [0, 1] (``PostProcess(dtype=torch.float32)``) / default uint8.
                 ``per_episode = ceil(batches x batch / episodes)`` windows per episode per epoch, so one
                 epoch is about the timed batches and its windows lie across the whole dataset, like
                 LeRobot's shuffle over all frames; the timed region is one full epoch, so all
                 decoding for the timed windows is in it (warm-up: the last 2 batches of epoch 0,
                 reached by exact resume, so nothing is in flight when the timed epoch starts).
    ``es-f32c``              float32 [0, 1] batches from a uint8 reader with this tool's own collate that
                 converts while it copies into the shared-memory batch (the reader now does the same by
                 itself under ``WindowLoader``: ``stream.collate.FloatCollate``; kept for comparison).
    ``es-f32m`` (on request) uint8 through the DataLoader, converted in the main process into two
                 reused float32 buffers (a batch is overwritten two batches later).
    ``es-f32-pe4``           4 windows per episode per epoch: little reuse of decoded frames. The
                 dataset is listed ``k`` times in one ``WindowDataset`` (as many episodes as a dataset
                 ``k`` times larger) so an epoch again covers the timed batches; one full epoch timed.
    ``es-f32-all``           every anchor every epoch: each frame is decoded once per epoch and reused
                 by ~9 windows. An epoch is ~1400-2100 windows, longer than the run: the timed
                 batches are inside epoch 0 after its first episodes were loaded (the loading shows
                 in the time to first batch), so this is the in-epoch rate, an upper bound.
    ``es-f32-v2``, ``es-u8-v2`` (the latter on request)   the same on shards converted from the v2.x original.

Reported per dataset and system: samples/s and returned frames/s (medians over rounds, min..max),
frames decoded per frame returned (epishard telemetry; counted the same way for webdataset and naive;
for LeRobot the expectation over uniform anchors from the keyframe tables), time to first batch (for
LeRobot: its harness reports only the 2 warm-up batches), peak RSS and PSS of the main process plus
its workers (the harness's schedule: RSS from ``statm`` every 50 ms, PSS from ``smaps_rollup`` every
500 ms), bytes read per sample, distinct episodes per batch, worker seconds per stage. Every run is
its own process (LeRobot's: the harness; ours: forked from a process that imported torch, torchcodec,
... once, whose PSS is added; ``--fresh-process`` starts an interpreter per run instead). Systems
alternate within a round (order reversed every other round) and the ratio epishard / peer is taken
per round, then the median.

Commands (repository root; peers that are not installed are skipped with a line saying how):

    python tools/bench_peers.py                              # all v3.0 datasets in ../shared/data
    python tools/bench_peers.py --setup-peers                # first build the LeRobot peer venv (~75 s)
    python tools/bench_peers.py --batches 30 --rounds 5 --out /tmp/peers.jsonl --charts /tmp/charts
    python tools/bench_peers.py --source sample/gr00t_robot_sim_picknplace --batches 3 --rounds 1
    python tools/bench_peers.py --systems lerobot,es-f32,es-f32c,es-f32m --datasets unitree_g1_bottle_av1_v30
"""
