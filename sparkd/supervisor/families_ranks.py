"""The failure families between the ranks (a peer gone, a rendezvous that never formed, the collective library) and of
vLLM's own processes (a rank that stopped answering, the engine's death): the second half of the family table
(`families.py` reads them in its order and says how). Pure."""

from __future__ import annotations

import re

from sparkd.supervisor.devicecodes import code_signs
from sparkd.supervisor.events import Kind
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.families_node import ERROR_LINES
from sparkd.supervisor.familykit import Family, sign
from sparkd.supervisor.lexicon import TIMED_OUT
from sparkd.supervisor.peerloss import PEER_LOST_MARKERS
from sparkd.supervisor.rulekit import (
              CUSTOM_AR,
              FORK,
              SHM_FULL,
              Tier,
              const,
              fmt,
              what_nccl,
              what_nccl_remote,
              what_peer,
              what_peer_link,
)
from sparkd.supervisor.sentences import MEMLOCK_DO
from sparkd.supervisor.subsystems import Subsystem

__all__ = ["BETWEEN_RANKS", "PROCESSES"]

F, S, K = FailureClass, Subsystem, Kind
G = Tier.GENERIC
_I = re.IGNORECASE
CLOSED, STORE_DOWN = (re.escape(marker) for marker in PEER_LOST_MARKERS)  # one list, read by the instance watch too
_TIMEOUT_TYPES = r"\w*Time[dD]?[oO]ut\w*|timeout"
# a peer word, then (within the sentence's reach) what became of it: Ray's node death in any of its formats (its
# raylet's, its GCS's, the autoscaler's), a remote rank or host that went away
_PEER_GONE = (r"\b(?:nodes?|peers?|raylet|remote (?:process|rank|host|end|worker|side|server)|head node|worker node|"
              r"other ranks?)\b[^\n]{0,240}?(?P<said>\b(?:(?:has been|was) marked dead|is dead|dead|died|dies|lost|"
              r"removed|disconnected|is down|went down|failed health ?checks?|missed too many heartbeats|heartbeats? "
              r"(?:timeout|timed out|missed|lost)|no longer (?:alive|reachable)|(?:was|has been) terminated|preempted|"
              r"exited|crashed|shut ?down)\b.*)|"
              r"(?P<lost>\b(?:lost|disconnected from|removed)\b[^\n]{0,60}\b(?:node|peer|raylet|remote)\b.*)")
_OTHER_CCL = r"hccl|hccp|rccl|oneccl|xccl|\bhcom|mscclpp|nvshmem"

BETWEEN_RANKS: tuple[Family, ...] = (
    Family(F.peer_lost, "The peer rank went away", (
        sign("NCCL's ncclRemoteError: the remote rank exited or the network between the ranks failed, in NCCL's "
             "wrapper's words — what the other ranks see of a failure at the far end, whatever it was (a rank whose "
             "NCCL failed, a death): generic like the store's reset, so an earlier error of NCCL's own on a rank, "
             "which the others then see as this, stays the cause", terms="ccl", what=what_nccl_remote, tier=G,
             message=r"NCCL error(?: in: [^,]*,)?:? remote process exited or there was a network error"),
        sign("NCCL's error code for it", message=r"ncclRemoteError", terms="ccl", what=what_nccl_remote, tier=G),
        sign("NCCL's own sentence for a remote rank gone", terms="ccl", tier=G,
             message=r"remote process exited or there was a network error"),
        sign("Ray reports a node of the cluster dead", types=r"NodeDiedError"),
        sign("torch's store found its connection to the head closed or reset: the head is gone on a headless worker, "
             "fallout of a local death on the node that lost it (generic, so the earlier death wins)", tier=G,
             message=rf"(?:recvValue failed|Failed to recv).*?(?P<why>{CLOSED}|Connection reset by peer|Broken pipe)",
             what=what_peer),
        sign("ProcessGroupNCCL could not read the store's dump flag: the store is gone", tier=G, what=what_peer,
             message=r"Failed to check the \"should dump\" flag on TCPStore"),
        sign("the store's own word that it shut down", message=rf"(?P<why>{STORE_DOWN})", tier=G, what=what_peer),
        sign("a rank's connection closed by the other side (Gloo's pair, torch's socket)", tier=G,
             message=r"(?P<why>Connection closed by (?:remote )?peer)", what=what_peer_link),
        sign("ProcessGroupNCCL's heartbeat monitor found the store gone", tier=G, what=what_peer,
             message=r"ProcessGroupNCCL.*(?P<why>HeartbeatMonitor)"),
        sign("torch's store or process group found the connection to the other rank reset or closed: fallout of a "
             "local death too, so generic (an HTTP client's reset is no rank's)",
             message=r"Connection reset by peer|Connection closed by (?:remote )?peer|Broken pipe", kinds={K.torch},
             tier=G),
        sign("the same raised by torch.distributed", types=r"Dist\w*Error",
             message=r"Connection reset by peer|Connection closed by (?:remote )?peer|Broken pipe", tier=G),
        sign("a rank's connection to another rank reset or broken under a collective or the process group (Gloo's "
             "pair: `Read error [addr]:port: Connection reset by peer`, `Write error ...: Broken pipe`): the rank at "
             "the other end went away; generic, as a local death's fallout is too (an HTTP client's reset is raised "
             "in no collective)", raised_in={S.collective, S.distributed}, tier=G, what=what_peer_link,
             message=r"(?P<why>Connection reset by peer|Broken pipe|Connection closed by (?:remote )?peer)"),
        sign("Gloo's TCP pair names the peer whose connection was reset or broken, whoever raised it", tier=G,
             message=r"(?:Read|Write) error \[[^\]]+\]:\d+: (?P<why>Connection reset by peer|Broken pipe)",
             what=what_peer_link),
        sign("a node, a peer or a remote rank and what became of it (dead, died, lost, removed, failed health "
             "checks), in any of Ray's formats or another writer's — not a GPU or NUMA node, not one killed for "
             "memory (Ray's memory monitor is oom's)", terms="peer gone", unless_terms="mem oom", message=_PEER_GONE,
             unless=r"\b(?:GPU|NUMA) node\b|\bnode-\d+ \(Agent", flags=_I, tier=G),
        sign("the event Ray's GCS records when it removes a node", message=r"\bRAY_NODE_REMOVED\b", tier=G),
    )),
    Family(F.rendezvous_timeout, "The ranks never met at the torch.distributed rendezvous", (
        sign("the head's store names how long it waited and how many ranks came", terms="timeout",
             message=r"Timed out after (?P<secs>\d+) seconds waiting for clients\. (?P<joined>\d+)/(?P<want>\d+) "
                     r"clients joined", what=fmt("The head waited {secs} s for the worker to join the rendezvous and "
                                                 "only {joined}/{want} ranks arrived")),
        sign("the worker's store client names the head it could not reach", terms="timeout",
             message=r"client socket has timed out after (?P<ms>\d{1,18})ms while trying to connect to "
                     r"\((?P<host>[^,]+), (?P<port>\d+)\)",
             what=lambda m, ctx: (f"The worker could not reach the head's rendezvous at {m.group('host')}:"
                                  f"{m.group('port')} for {int(m.group('ms')) // 1000} s")),
        sign("Gloo's send during the rendezvous timed out", message=r"Timed out waiting \d+ms for send operation to "
                                                                    r"complete",
             terms="timeout", what=const("A gloo send to the other rank timed out during distributed init")),
        sign("a store request to the head timed out", message=r"DistStoreError: Socket Timeout", tier=G,
             what=const("A torch.distributed store request to the head timed out (DistStoreError: Socket Timeout)")),
        sign("Ray could not place every rank on the cluster (vLLM's timeout, or Ray's autoscaler finding no node that "
             "fits), so they never started to meet",
             message=r"Cannot provide a placement group|No available node types can fulfill resource request"),
        sign("the same in other words: the cluster without the accelerators a rank asks for, a placement group or "
             "resource request that cannot be placed or is infeasible, Kubernetes' scheduler finding no node with the "
             "accelerators asked for (`0/3 nodes are available: 3 Insufficient nvidia.com/gpu`); the driver's own "
             "node without one is a configuration (families.py)", flags=_I, terms="peer",
             message=r"\bcluster\b[^.\n]{0,80}\b(?:has no|no) (?:GPU|NPU|TPU|XPU|HPU|accelerator)s? "
                     r"available|\b(?:cannot|can't|could not|unable to) (?:be )?(?:provide|place|placed|fulfill|"
                     r"satisf\w+|schedul\w+)\b[^.\n]{0,60}\b(?:placement group|resource request|bundle)|"
                     r"\binfeasible (?:task|actor|resource|placement)|\b0/\d+ nodes are available:.{0,80}"
                     r"\bInsufficient \S+"),
        sign("torch's store raises DistStoreError when the ranks do not all arrive in time",
             types=r"DistStoreError", tier=G),
        sign("a rank could not reach the store or the Gloo mesh of the others",
             message=r"client socket has timed out after \d+ms while trying to connect|connectFullMesh|"
                     r"Gloo connect\w* failed|Timed out waiting \d+ms for send operation|"
                     r"waiting for clients\. \d+/\d+ clients joined"),
        sign("a connection that fails while the process group is being set up (not NCCL's own error)",
             message=r"[Cc]onnection refused|[Tt]imed out|[Tt]imeout|No route to host|Network is unreachable|"
                     r"Name or service not known", raised_in={S.distributed}, unless=r"\bNCCL\b"),
        sign("NCCL's ranks exchange their id through torch's store first: a store that times out there is the "
             "rendezvous", message=r"ncclUniqueId .{0,80}store.{0,200}(?:[Tt]imeout|timed out)"),
        sign("the store, the rendezvous or the process group's setup with a connection that could not be made or a "
             "wait that ran out, in any words (not a collective's timeout, not a connection the peer closed, not a "
             "wait that retries: that is rules.py's)",
             terms="store", unless_terms="ccl", flags=_I,
             unless=r"\bretry|\bretrying\b|\bwatchdog\b|collective operation|Process group work \w+, seq_num",
             message=r"failed to connect|could not connect|unable to connect|connect\w* (?:refused|timed out|failed)|"
                     rf"\brefused\b|{TIMED_OUT}|No route to host|unreachable|not known"),
        sign("torch.distributed's network error (or the rendezvous's own) for a connection that could not be made: "
             "the other rank or the head was never reached", types=r"DistNetworkError|Rendezvous\w*Error",
             message=r"failed to connect|could not connect|unable to connect|connect\w* (?:refused|timed out|failed)|"
                     rf"\brefused\b|No route to host|unreachable|not known|{TIMED_OUT}", flags=_I),
        sign("Gloo could not connect its mesh or timed out building it", terms="gloo", flags=_I,
             message=rf"connect\w*.{{0,80}}(?:fail\w*|{TIMED_OUT}|refused)|(?:{TIMED_OUT}).{{0,80}}"
                     r"connect"),
    )),
    Family(F.nccl, "NCCL failed", (
        sign("the RDMA NIC refused to register NCCL's memory: the locked-memory limit", terms="mem",
             message=r"(?P<msg>ibv_reg_mr\w*.*Cannot allocate memory.*)", do=MEMLOCK_DO,
             what=fmt("NCCL could not register memory with the RDMA NIC ({msg})")),
        sign("NCCL's WARN for a system call that failed", message=r"(?P<msg>NCCL WARN .*unhandled system error.*)",
             terms="ccl", what=what_nccl),
        sign("NCCL's InfiniBand transport failed", message=r"(?P<msg>NET/IB .* failed.*)", what=what_nccl),
        sign("a verbs call NCCL made failed", message=r"NCCL WARN (?P<msg>Call to ibv_\w+ failed[^,]*)", terms="ccl",
             what=what_nccl),
        sign("/dev/shm is full: NCCL could not grow or create its segment", terms="shm", do=SHM_FULL,
             message=r"(?:failed to extend|Error while creating shared memory segment) (?P<seg>/dev/shm/nccl-[^\s,]+)"
                     r".*No space left on device",
             what=fmt("NCCL could not allocate its shared-memory segment {seg}: /dev/shm is full (No space left on "
                      "device)")),
        sign("NCCL's own error codes", terms="ccl", what=fmt("NCCL failed with nccl{msg}"),
             message=r"\bnccl(?P<msg>InternalError|SystemError|InvalidArgument|InvalidUsage)\b"),
        sign("NCCL's wrapper of a CUDA call that failed: generic, because the CUDA error it names after it (`Last "
             "error: Cuda failure 'out of memory'`) is the cause when there is one", terms="ccl", tier=G,
             what=fmt("NCCL failed with nccl{msg}"), message=r"\bnccl(?P<msg>UnhandledCudaError)\b"),
        sign("NCCL's WARN line that says a call failed (not a remote rank gone: the peer family's)", terms="ccl",
             what=what_nccl, unless=r"remote process exited or there was a network error",
             message=r"NCCL WARN (?P<msg>.*?\b(?:[Ff]ailed|[Ff]ailure|[Ee]rror|[Uu]nable|[Cc]annot|[Tt]imeout|timed "
                     r"out)\b.*)"),
        sign("ProcessGroupNCCL's watchdog found a collective that timed out: a symptom an earlier cause explains",
             message=r"(?P<msg>Watchdog caught collective operation timeout)", tier=G, what=what_nccl),
        sign("ProcessGroupNCCL's watchdog itself got stuck", tier=G, what=what_nccl,
             message=r"(?P<msg>ProcessGroupNCCL's watchdog got stuck for \d+ seconds)"),
        sign("torch's and vLLM's NCCL wrappers name a failure of NCCL's own (its internal, argument and usage errors: "
             "codes the sign above reads, in ncclGetErrorString's words), which no other layer's line explains",
             terms="ccl", what=what_nccl, flags=_I,
             message=r"NCCL error(?: in: [^,]*,)?:? (?P<msg>(?:internal error|invalid argument|invalid usage)[^(\n]*)"),
        sign("the same wrappers naming an error NCCL met beneath it (an unhandled system or CUDA error): generic, the "
             "line that names the call that failed (a WARN of NCCL's, the CUDA error), before it or after, says more",
             message=r"NCCL error(?: in: [^,]*,)?:? (?P<msg>[^(\n]+)", terms="ccl", tier=G, what=what_nccl, flags=_I),
        sign("ProcessGroupNCCL's own report of a collective that failed or timed out",
             message=r"Some NCCL operations have failed or timed out|NCCL communicator was aborted", tier=G),
        sign("torch raises DistBackendError for a failure inside the collective backend (NCCL, RCCL)",
             types=r"DistBackendError", tier=G),
        sign("the collective libraries of other accelerators (HCCL on Ascend, oneCCL on XPU, RCCL) failing, in their "
             "words or their function names (HcclAllreduce, HcclCommInitRootInfo ...) — not their watchdog's end "
             "(`HCCL watchdog thread terminated with exception`), which reports what the watchdog found (the device's "
             "timeout beside it), generic as ProcessGroupNCCL's is",
             terms="ccl", flags=_I, unless=r"\bwatchdog thread terminated\b",
             message=rf"(?:{_OTHER_CCL})\w*\b.{{0,120}}\b(?:error|fail\w*|timeout|timed out|times out)\b|"
                     rf"\b(?:error|fail\w*)\b.{{0,120}}(?:{_OTHER_CCL})\w*"),
        sign("Ascend's EI error codes are HCCL's (EI0006: getting a socket to the other ranks timed out)",
             message=r"\bEI\d{4}\b"),
        sign("oneCCL's own error line (Intel's collective library on XPU and CPU: `|CCL_ERROR| ...`, `|CCL_FATAL|`)",
             message=r"\|CCL_(?:ERROR|FATAL)\|"),
        sign("a collective library by its name (NCCL, RCCL, HCCL, oneCCL, a function of theirs) with a failure or a "
             "timeout, on an error line — not a library file that will not load (the image's)", terms="ccl",
             unless_terms="lib", tier=G, flags=_I,
             message=rf"\b(?:error|fail\w*|fatal|abort\w*|invalid|unhandled|exception)\b|{TIMED_OUT}"),
        sign("a collective (an all-reduce, a barrier, the watchdog's) that timed out: the backend or a rank under it "
             "(not the executor's shared-memory queue)", terms="collective timeout", unless_terms="shm", tier=G),
        sign("a timeout raised inside a collective", types=_TIMEOUT_TYPES, raised_in={S.collective}, tier=G),
        sign("the KV-transfer library between vLLM instances (NIXL, over UCX or RDMA, in disaggregated prefill and "
             "decode) failing, by its error type or code: the transport between the ranks, as NCCL's is (UCX's own "
             "lines are not read: it logs errors it recovers from)",
             message=r"\bnixl\w*Error\b|\bNIXL_ERR_\w+", kinds={K.python, K.vllm, K.other}),
        sign("a Bus error (SIGBUS) in a rank: a shared-memory segment (NCCL's, in /dev/shm) could not be backed, "
             "/dev/shm is too small or full", message=r"Fatal Python error: Bus error"),
        sign("a native crash whose faulting function is NCCL's own (its proxy thread, an nccl* call)",
             message=r"\bPC: @\s+0x[0-9a-f]+\s.*\b(?:nccl\w*|\w*[Pp]roxy\w*)\(\)"),
    )),
)

PROCESSES: tuple[Family, ...] = (
    Family(F.hang, "A rank stopped answering", (
        sign("the executor's RPC to the workers names the call that timed out", tier=G,
             message=r"RPC call to (?P<rpc>\w+) timed out",
             what=fmt("A rank stopped answering: the RPC call to {rpc} timed out")),
        sign("the API server gave up waiting for its engine to start", tier=G,
             message=r"Timed out waiting for engines? ?(?:to ?send ?initial ?message|core processes to start)",
             what=const("vLLM gave up waiting for its engine to start after VLLM_ENGINE_READY_TIMEOUT_S"),
             do="raise VLLM_ENGINE_READY_TIMEOUT_S if loading is just slow — sparkd restarts with backoff"),
        sign("the executor's wait for a worker's answer (the shared-memory queue, an RPC) ran out",
             types=rf"{_TIMEOUT_TYPES}|Empty", raised_in={S.rpc}, tier=G),
        sign("Ray's executor waited for a worker's output (a compiled graph's channel, a ray.get) until it timed out",
             types=r"RayChannelTimeoutError|GetTimeoutError", tier=G),
        sign("the device runtime's own word that a compute unit's task ran past the runtime's timeout (CANN's `The "
             "aicore execution times out`, its 507014 AICORE_TIMEOUT in words): a kernel or a collective on the "
             "device stuck, which the watchdog that then ends the rank only reports", flags=_I,
             message=r"\b(?:ai ?core|ai ?cpu|vector core)\b[^.\n]{0,40}\btime[sd]? ?out\b"),
        sign("a collective the process group had dispatched timed out (torch_npu's `Process group work ALLGATHER, "
             "seq_num 250 dispatch timeout`): its sequence number says the ranks had met and run the collectives "
             "before it, so a rank stopped inside one, not a rendezvous that never formed",
             message=r"Process group work (?P<op>\w+), seq_num (?P<seq>\d+) (?:\w+ )?timeout",
             what=fmt("A rank stopped answering: the process group's {op} (work {seq}) timed out")),
        sign("an RPC to a rank that timed out, in other words", terms="timeout", tier=G,
             message=rf"\bRPC\b[^.\n]{{0,80}}(?:{TIMED_OUT})|(?:{TIMED_OUT})[^.\n]{{0,40}}\bRPC\b"),
        *code_signs(F.hang, ERROR_LINES),
    )),
    Family(F.engine_dead, "vLLM's engine died", (
        sign("Ray's runtime on this node (the raylet, or the core worker inside vLLM's engine) aborted on a failed "
             "check of its own ('You have likely discovered a bug in Ray', Ray's C++ line at its `C` level): the "
             "engine dies with the runtime that carries its workers (not another node's raylet, `(raylet, ip=…)`)",
             kinds={K.ray}, message=r"(?:discovered a bug in Ray.*?)?(?P<said>\bCheck failed\b.*)|"
                                    r"discovered a bug in Ray",
             unless=r"^\(raylet, ip=",
             what=const("vLLM's engine died with Ray's runtime, which aborted on a failed check of its own (Ray's "
                        "words: 'You have likely discovered a bug in Ray')")),
        sign("vLLM's CUDACHECK in its custom all-reduce printed the CUDA error and exited the worker (older builds "
             "print it without `Cuda error`), at whatever level a launcher that carries vLLM's output logs it "
             "(Dynamo's `INFO dynamo_engine_vllm::worker: VLLM: Failed: …`)", do=CUSTOM_AR, any_level=True,
             needles=("custom_all_reduce",),
             message=r"Failed: (?:Cuda error )?(?P<file>\S*custom_all_reduce\S*?):(?P<line>\d+) '(?P<err>[^']+)'",
             what=fmt("vLLM's custom all-reduce failed with a CUDA error ('{err}' at {file}:{line})")),
        sign("vLLM's CUDACHECK in its kernels printed the CUDA error and exited the worker",
             message=r"Failed: Cuda error (?P<file>\S+?):(?P<line>\d+) '(?P<err>[^']+)'",
             what=fmt("A CUDA call in vLLM's kernels failed ('{err}' at {file}:{line})")),
        sign("vLLM's shared-memory ring could not attach (a fork, or the GB10 cold-boot race)", do=FORK, terms="shm",
             message=r"'ShmRingBuffer' object has no attribute 'shared_memory'",
             what=const("vLLM's shared-memory ring could not attach ('ShmRingBuffer' object has no attribute "
                        "'shared_memory')")),
        sign("Ray reports a worker's actor (or the worker, or the owner of its objects) dead without saying why (its "
             "node's death is peer_lost, an error inside it or Ray's memory monitor say more): a worker died",
             types=r"ActorDiedError|RayActorError|ActorUnavailableError|WorkerCrashedError|OwnerDiedError",
             unless=r"creation task|memory", tier=G),
        sign("the same in Ray's own sentence, quoted by whoever caught it (a launcher's 'Server error: 500 - ...'), "
             "from how the worker exited where Ray says it: Ray's list of possible causes (an OOM kill, `ray stop`, "
             "a crash) names none of them; its memory monitor's kill is oom's", tier=G,
             message=r"The actor (?:died unexpectedly before finishing this task|is dead because its worker process "
                     r"has died)(?:.*?Worker exit detail: (?P<said>.*))?",
             unless=r"creation task|running low on memory|memory monitor|OUT_OF_MEMORY"),
        sign("a read of the executor's shared-memory queue that was cancelled (`RuntimeError: cancelled` raised in "
             "it): vLLM's MessageQueue raises it only when the queue is shut down under a waiting reader, which the "
             "executor does when its monitor sees a worker process die (or on its own shutdown) — a process of the "
             "engine ended, not a wait that ran out (that is the TimeoutError, the hang's)", tier=G,
             types=r"RuntimeError", raised_in={S.rpc}, message=r"^cancelled\b",
             what=const("A process of vLLM's engine ended: the executor shut down the shared-memory queue the engine "
                        "was reading, as it does when a worker process dies")),
        sign("vLLM raises EngineDeadError in the API server once its engine core is gone: a consequence",
             types=r"\w*EngineDeadError", tier=Tier.CONSEQUENCE),
    )),
)
