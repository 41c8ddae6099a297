"""Instance prices and sizes: the shipped table (prices.json, with the date each figure was
read and its source), optionally overridden by a user file, and cost arithmetic.

Cost per step = price per hour x time per step, as AWS computes it; everything here is
that arithmetic, nothing is fetched from the network.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from hetrl.rollout.errors import ConfigError

PRICES_FILE = Path(__file__).with_name("prices.json")
PRICES_ENV = "HETRL_PRICES"  # a JSON file in the same format; its entries win


@dataclasses.dataclass(frozen=True)
class Instance:
    """One instance type: on-demand price per hour and its size."""

    name: str
    price_per_hour: float
    vcpus: int
    gpus: int = 0
    gpu: str = ""
    source: str = ""
    read: str = ""


@dataclasses.dataclass(frozen=True)
class PriceTable:
    instances: dict[str, Instance]
    spot_discount: float
    region: str

    def get(self, name: str) -> Instance:
        """The instance type `name` (the `ml.` prefix is optional).

        Raises:
            ConfigError: unknown type; the message lists near names and how to add one.
        """
        key = name if name.startswith("ml.") else f"ml.{name}"
        if key in self.instances:
            return self.instances[key]
        family = key.rsplit(".", 1)[0]
        near = sorted(k for k in self.instances if k.startswith(family))[:6]
        raise ConfigError(
            f"no price for {name!r}{f' (known: {near})' if near else ''}; add it to a JSON "
            f"file in the format of {PRICES_FILE.name} and point {PRICES_ENV} (or --prices) "
            "at it"
        )


def load_prices(override: str | Path | None = None) -> PriceTable:
    """The shipped table, with entries of `override` (or $HETRL_PRICES) on top."""
    data = json.loads(PRICES_FILE.read_text())
    override = override or os.environ.get(PRICES_ENV)
    instances = dict(data["instances"])
    spot = data.get("spot_discount_default", 0.7)
    if override:
        try:
            extra = json.loads(Path(override).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read price file {override}: {exc}") from exc
        instances.update(extra.get("instances", {}))
        spot = extra.get("spot_discount_default", spot)
    table = {}
    for name, entry in instances.items():
        try:
            table[name] = Instance(
                name=name, price_per_hour=float(entry["price_per_hour"]),
                vcpus=int(entry.get("vcpus", 0)), gpus=int(entry.get("gpus", 0)),
                gpu=entry.get("gpu", ""), source=entry.get("source", entry.get("derived", "")),
                read=entry.get("read", ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"price entry {name!r} is malformed: {exc}") from exc
    return PriceTable(table, float(spot), data.get("region", "us-east-1"))


def cost_per_million_steps(price_per_hour: float, env_steps_per_second: float) -> float:
    """Dollars per million env steps at a price per hour and a throughput."""
    if env_steps_per_second <= 0:
        return float("inf")
    return price_per_hour / 3600.0 / env_steps_per_second * 1e6
