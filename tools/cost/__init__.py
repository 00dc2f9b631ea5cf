"""H200 cost model of a launch list: per launch, the largest of its tensor, SM-pipe, L2,
HBM, mapped-host-memory, serial-chain and replay times, plus a launch cost, in three scenarios;
the graph replayed CTA by CTA; the figure's sensitivity to each input.

  .venv/bin/python -m tools.build_ptx --report [--json] [--measured FILE]
  .venv/bin/python -m tools.cost [--profile P] [--submission forward|update|final] [--json]
                                 [--measured FILE]

A launch is costed from what the plan says it does (`launches.submissions(profile)`: grid,
arguments, constexprs, warps) and what ptxas says it needs (registers; shared memory from the
manifest), so no GPU is needed.  Each kernel family (REGISTRY, keyed by the Triton function name)
describes its programs: how many loop trips each makes, what one trip and the prologue/epilogue do
(MMA FLOPs, bytes loaded and stored, MUFU and ALU operations, dependent waits), the unique HBM
bytes of the launch, and what it reads or writes in mapped host memory (staging).  From that:

  tensor  = ceil(P / H) · FLOPs per program / (bf16 rate / 132)  — the busiest SM's MMA work
            (or the largest program's), H the SMs the grid holds (bounds.held_sms): the block
            scheduler spreads a grid one CTA per SM first (inputs.PLACEMENT), so H = min(P, 132)
            alone on the chip, and the programs resident on one SM share its tensor cores.
            A kernel whose PTX multiplies with mma.sync and no wgmma (below 64 rows a
            warpgroup; every sm_80 kernel) gets MMA_SYNC_RATE of the rate (bounds.mma_rate).
  pipes   = the same for the MUFU and ALU work (exp, division, compares): the SM's other pipes.
  l2      = every byte every program loads or stores / L2 bandwidth, and at least the busiest
            SM's bytes over one SM's L2 path.
  hbm     = unique bytes read + written / HBM bandwidth.
  pcie    = staging reads (bytes / PCIe bandwidth, or requests · latency / requests in flight,
            whichever is larger) + staging writes / bandwidth.
  serial  = programs placed as the block scheduler places them (sm_sim.py), k per SM at most
            (k from registers, shared memory, threads, blocks per SM); each a loop phase (trips ×
            one trip) then a prologue/epilogue phase, its parts overlapped as the scenario says;
            the CTAs working on one SM share its throughput (inputs.SHARING), so CTAs released
            together with the same work run in step — K loops together, then epilogues
            together.  The longest program's chain and wave quantization both show here.  What waits on what inside a program is read off
            the kernel's PTX (ptx_chain.py): a tile's dependent round trips (each load issued
            after a store or barrier that waited for an earlier load: weight_grad's AdamW
            epilogue has 24 per tile, and the K loop's fill one more) at HBM_LATENCY each, its
            CTA-wide barriers at PHASE each, and its issue slots (ptx_ops.py: div.rn/sqrt.rn as
            ptxas expands them) on the SM's pipes — added, since each waits for the one before.
  replay  = serial with each phase asking the chip's L2 and HBM for its own bytes (the loops'
            the operands, the epilogues' their own output and state): CTAs in step ask at once,
            so a launch whose loops outrun L2 (or whose epilogues outrun HBM) takes longer than
            its bytes spread evenly would.  It is the launch alone as the graph replays it.
  launch  = max(the bounds above) + the launch cost inside a graph.
  hbm     less the bytes a launch reads right after a predecessor wrote them (fresh.py): the
            scenario's L2_RESIDENT of them hit L2 while they fit in it (L2_BYTES).

The graph (lanes.py, sm_sim.py) is replayed CTA by CTA on 132 SMs: each launch's CTAs are its
programs' phases, placed as registers and shared memory free up (a CTA that fills an SM needs an
empty one), the plan's priority lane's grids first, then in launch order, programmatic edges'
CTAs resident at their wait, each SM's throughput shared by the CTAs on it (of either lane), HBM
and L2 shared by all.  It reports each lane's start and end and the critical lane.  The
sensitivity analysis (sensitivity.py) replays it again with each input alone at its optimistic
and its pessimistic value.

Every input is a named constant in inputs.py with its source (a datasheet, a measurement in
/work/.library/device/KINDS.md, or a stated assumption); what each kernel does is in the family
modules kernels_*.py (gathered by kernels.py) on the vocabulary of work.py.  No figure here was
measured on a GPU: the device check's per-launch table (`--measured`) is what calibrates them.

The modules, each importing only those above it:
  inputs.py        the chip's figures and the scenarios' assumptions, each with its source
  work.py          what one program does (Step, Programs, Work), the registry, AdamW's shares
  ptx_parse.py     a PTX entry's instructions, blocks and loops
  ptx_ops.py       issue slots per thread of a stretch of PTX
  ptx_levels.py    the level machine: what waits for which round trip
  ptx_chain.py     per kernel, its dependent round trips per tile (Chain), from kernels_ptx/
  kernels*.py      the kernel families' entries, registered in kernels.REGISTRY
  kernel_stats.py  ptxas -v on the committed PTX; occupancy
  sm_sim.py        the block scheduler: grids' CTAs on 132 SMs, event by event, SMs shared
  sm_clocks.py     the SMs' side of it: free footprints, clocks, shared rates, HBM/L2 asks
  bounds.py        one launch's bounds in one scenario, on some SMs; its CTAs' phases
  fresh.py         bytes a launch reads that its predecessors just wrote (plan/launches/regions.py)
  per_launch.py    each launch alone on the chip (LaunchCost), a submission's list (model)
  lanes.py         the submission's graph replayed on two lanes (per lane start, end, critical);
                   its forward and backward windows and how near each runs to L2, HBM, tensor
  sensitivity.py   the graph with each input moved alone (the tornado table), the placement what-if
  sections.py      the report's lanes, round-trip and sensitivity sections
  table.py         buckets, floors, the JSON and the markdown table
  measured.py      the device check's per-launch table beside the model
  report.py        all of it for one submission (report); __main__.py its command line
"""
