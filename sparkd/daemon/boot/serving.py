"""The daemon's two listeners and who may hold a connection to each (``sparkd.api.bounded``): the control socket
(per uid, root's slots kept apart) and the TCP port (per source address, the peers' slots kept apart, TLS when
configured); and the peers' addresses, resolved again every ``REFRESH_S`` when they are host names."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from sparkd.api.admission import Limits
from sparkd.api.bounded import Listener, tcp_caller, unix_caller
from sparkd.api.http11 import serve
from sparkd.api.server import build_app, build_tcp_app
from sparkd.cluster.addresses import REFRESH_S, PeerAddresses
from sparkd.commands.port import Control
from sparkd.commands.rank import RANK
from sparkd.config import Config

if TYPE_CHECKING:
    from sparkd.host.logs import Logger

UNIX_LIMITS = Limits(general=48, per_source=16, per_trusted=16)  # per uid; root keeps 16 of its own


def start_servers(tg: TaskGroup, unix: Any, tcp: Any, control: Control, metrics: Callable[[], bytes], *,
                  cfg: Config, token: str | None, peers: PeerAddresses | None, tls: ssl.SSLContext | None,
                  log: Logger) -> None:
    tg.start_soon(serve, build_app(control), unix, Listener(unix_caller, UNIX_LIMITS))
    if tcp is not None:
        if cfg.api.token_file is not None and token is None:
            log.error("token_unreadable", path=str(cfg.api.token_file))
        app = build_tcp_app(control, token, metrics, RANK, tls=cfg.api.tls, log=log)
        tg.start_soon(partial(serve, app, tcp, Listener(tcp_caller(peers)), ssl_context=tls))
    if peers is not None:
        tg.start_soon(resolve_peers, peers, log)


async def resolve_peers(addresses: PeerAddresses, log: Logger) -> None:
    """Peers named by host name: resolved again every REFRESH_S, off the loop; what fails is logged."""
    unresolved = addresses.unresolved
    while True:
        if unresolved:
            log.warning("peer_unresolved", peers=unresolved,
                        note="their connections get no reserved room and no /v1/* until they resolve")
        await anyio.sleep(REFRESH_S)
        unresolved = await anyio.to_thread.run_sync(addresses.refresh)
