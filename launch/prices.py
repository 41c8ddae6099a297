"""Instance prices and sizes: the shipped table (prices.json, with the date each figure was
read and its source), optionally overridden by a user file or by live prices, and cost
arithmetic.

Cost per step = price per hour x time per step, as AWS computes it. Live prices
(`--prices live[:REGION]`) are current SageMaker on-demand training prices from the AWS
Price List API (boto3's `pricing` client, AWS credentials needed), cached for a day with
the date they were read; without credentials or network the shipped table is used, with
a line saying so. Nothing else here touches the network.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

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


LIVE = "live"
"""`--prices live` (us-east-1) or `--prices live:REGION`: prices from the AWS Price List API."""
CACHE_HOURS = 24
_TRAIN_USAGE = re.compile(r"(?:[A-Z0-9]+-)?Train:(ml\.[a-z0-9-]+\.[a-z0-9]+)")


def load_prices(override: str | Path | None = None) -> PriceTable:
    """The shipped table, with entries of `override` (or $HETRL_PRICES) on top: a JSON
    file, or `live[:REGION]` for current prices (see the module docstring)."""
    data = json.loads(PRICES_FILE.read_text())
    override = override or os.environ.get(PRICES_ENV)
    instances = dict(data["instances"])
    spot = data.get("spot_discount_default", 0.7)
    region = data.get("region", "us-east-1")
    if isinstance(override, str) and (override == LIVE or override.startswith(LIVE + ":")):
        live_region = override.partition(":")[2] or "us-east-1"
        live = live_prices(live_region)
        if live is not None:
            for name, entry in live.items():  # sizes from the table where it knows them
                instances[name] = {**instances.get(name, {}), **entry}
            region = live_region
        override = None
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
    return PriceTable(table, float(spot), region)


def cache_file(region: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "hetrl" / f"sagemaker-training-prices-{region}.json"


def live_prices(region: str, client: Any = None,
                now: datetime.datetime | None = None) -> dict[str, dict[str, Any]] | None:
    """Current on-demand SageMaker training prices of `region` as price-file entries,
    from the cache when it is under CACHE_HOURS old, else from the Price List API (then
    cached); None, with a line on stderr, when they cannot be read."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    path = cache_file(region)
    try:
        cached = json.loads(path.read_text())
        read = datetime.datetime.fromisoformat(cached["read"])
        if now - read < datetime.timedelta(hours=CACHE_HOURS) and cached["instances"]:
            return cached["instances"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        if client is None:
            import boto3  # the Price List API answers in us-east-1 for every region

            client = boto3.client("pricing", region_name="us-east-1")
        instances = fetch_live_prices(client, region, now)
    except Exception as exc:  # no boto3, credentials, network or permission: say so
        print(f"hetrl: live prices for {region} unavailable ({type(exc).__name__}: {exc}); "
              f"using the shipped table ({PRICES_FILE.name})", file=sys.stderr)
        return None
    if not instances:
        print(f"hetrl: the AWS Price List API lists no SageMaker training prices for "
              f"{region}; using the shipped table ({PRICES_FILE.name})", file=sys.stderr)
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"read": now.isoformat(), "region": region,
                                    "instances": instances}, indent=1))
    except OSError:
        pass  # a cache that cannot be written only costs a new request next time
    return instances


def fetch_live_prices(client: Any, region: str,
                      now: datetime.datetime) -> dict[str, dict[str, Any]]:
    """Every on-demand training instance price of `region` (usage type `...Train:ml.*`),
    read with the `pricing` client's GetProducts."""
    day = now.date().isoformat()
    instances: dict[str, dict[str, Any]] = {}
    pages = client.get_paginator("get_products").paginate(
        ServiceCode="AmazonSageMaker", FormatVersion="aws_v1",
        Filters=[{"Type": "TERM_MATCH", "Field": "regionCode", "Value": region}])
    for page in pages:
        for item in page.get("PriceList", []):
            product = json.loads(item) if isinstance(item, str) else item
            attributes = product.get("product", {}).get("attributes", {})
            match = _TRAIN_USAGE.fullmatch(attributes.get("usagetype", ""))
            price = _hourly_usd(product)
            if not match or not price:
                continue
            entry: dict[str, Any] = {
                "price_per_hour": price, "read": day,
                "source": f"AWS Price List API, AmazonSageMaker, {region}, usage type "
                          f"{attributes['usagetype']}, on-demand"}
            vcpus = str(attributes.get("vCpu", "")).strip()
            if vcpus.isdigit():
                entry["vcpus"] = int(vcpus)
            instances[match.group(1)] = entry
    return instances


def _hourly_usd(product: dict[str, Any]) -> float:
    """The product's on-demand USD price per hour (0 when it has none)."""
    for term in product.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            if dimension.get("unit", "").lower() in ("hrs", "hours", "hour"):
                try:
                    return float(dimension["pricePerUnit"]["USD"])
                except (KeyError, ValueError):
                    continue
    return 0.0


def cost_per_million_steps(price_per_hour: float, env_steps_per_second: float) -> float:
    """Dollars per million env steps at a price per hour and a throughput."""
    if env_steps_per_second <= 0:
        return float("inf")
    return price_per_hour / 3600.0 / env_steps_per_second * 1e6
