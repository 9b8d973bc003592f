"""``aenv node ls`` and ``aenv node drain``: a cluster's nodes, seen through its Redis.

``drain NODE`` is a rolling upgrade's step: the node stops taking placements and hands every
sandbox to the shared repository (its ``POST /node/drain``), then each sandbox that was
running is resumed through the gateway (the API URL: ``E2B_API_URL`` or ``aenv auth``'s),
which places it on another node. Paused ones stay paused, resumable anywhere.
"""

from __future__ import annotations

import json
from typing import Annotated

import httpx
import typer
from rich.progress import Progress
from rich.table import Table

from aenv.cli.cluster import Cluster, redis_url
from aenv.cli.common import AsJson, err, examples, fail, out, run
from aenv.client.config import resolve

app = typer.Typer(help="A cluster's nodes.", no_args_is_help=True)

#: A drain writes every sandbox's memory to the repository: minutes for many large ones.
DRAIN_TIMEOUT_S = 1800.0


async def _nodes(url: str) -> tuple[list[dict[str, object]], int]:
    from aenv.cluster import registry
    from aenv.cluster.keys import Keys
    from aenv.cluster.redis_client import connect

    redis = connect(url)
    try:
        nodes, now = await registry.nodes(redis, Keys())
    finally:
        await redis.aclose()
    return [{**n.model_dump(), "health": n.health(now).value} for n in nodes], now


@app.command("ls", epilog=examples("aenv node ls --cluster redis://10.0.0.2:6379/0"))
def ls(cluster: Cluster = None, as_json: AsJson = False) -> None:
    """Every node with its health, load and address."""
    nodes, _ = run(lambda: _nodes(redis_url(cluster)))
    if as_json:
        out.print_json(json.dumps(nodes))
        return
    table = Table("NODE", "HEALTH", "SANDBOXES", "STARTING", "CPU %", "ADDRESS")
    for n in nodes:
        table.add_row(str(n["node_id"]), str(n["health"]), f"{n['running']}/{n['limit']}",
                      str(n["starting"]), str(n["cpu_pct"]), str(n["address"]))
    out.print(table)


@app.command(epilog=examples("aenv node drain node-a --cluster redis://10.0.0.2:6379/0",
                             "E2B_API_URL=http://gateway:8080 aenv node drain node-a"))
def drain(
    node_id: Annotated[str, typer.Argument(help="the node to drain (aenv node ls)")],
    cluster: Cluster = None,
    timeout: Annotated[int, typer.Option(help="lifetime (s) of each resumed sandbox")] = 300,
) -> None:
    """Move every sandbox off NODE: pause to the repository, resume elsewhere."""
    config = resolve()
    nodes, _ = run(lambda: _nodes(redis_url(cluster)))
    node = next((n for n in nodes if n["node_id"] == node_id), None)
    if node is None:
        fail(f"no node {node_id} in the cluster (aenv node ls)")
    headers = {"X-API-KEY": config.api_key or ""}

    async def flow() -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(DRAIN_TIMEOUT_S, connect=10)) as http:
            err.print(f"draining {node_id}: pausing its sandboxes to the repository")
            answer = await http.post(f"{node['address']}/node/drain", headers=headers)
            if answer.status_code != 200:
                fail(f"{node_id} refused the drain ({answer.status_code}): {answer.text[:300]}")
            done = answer.json()
            for sandbox_id, why in done["failed"].items():
                err.print(f"[red]{sandbox_id} stays on {node_id}:[/] {why}")
            not_resumed: list[str] = []
            with Progress(console=err, transient=True) as progress:
                task = progress.add_task("resuming elsewhere", total=len(done["moved"]))
                for sandbox_id in done["moved"]:
                    resumed = await http.post(
                        f"{config.api_url}/sandboxes/{sandbox_id}/connect",
                        json={"timeout": timeout}, headers=headers)
                    if resumed.status_code in (200, 201):
                        out.print(sandbox_id)
                    else:
                        not_resumed.append(sandbox_id)
                        err.print(f"[red]{sandbox_id} did not resume ({resumed.status_code}):[/]"
                                  f" {resumed.text[:200]} (it stays paused in the repository)")
                    progress.advance(task)
            err.print(f"{node_id}: {len(done['moved']) - len(not_resumed)} moved, "
                      f"{len(done['parked'])} paused ones left resumable anywhere, "
                      f"{len(done['failed']) + len(not_resumed)} failed")
            if done["failed"] or not_resumed:
                raise typer.Exit(1)

    run(flow)
