"""Settings: one pydantic-settings class, read from a TOML file and the environment.

Precedence, highest first: constructor arguments, ``TIERQ_*`` environment variables (nested
with ``__``: ``TIERQ_TIERS__FREE__MAX_WAIT_S``), the TOML file named by ``TIERQ_CONFIG``,
then the defaults. The three default tiers apply unless the TOML file declares its own
``[tiers]``; environment variables for a default tier override single fields of it.

Nothing is built at import time: call ``load_settings()`` and pass the result on.

Finding the system: every URL not configured comes from the data directory of ``tierq up``
(``data_dir``, default ``./.tierq``): its SQLite file, its Redis socket, and ``up.json``
naming its API. Where none is there, the ``resolved_*`` methods raise ``ConfigError`` with
one line saying what to set: never a silent fallback to a shared Redis or a fresh SQLite
file that would hold nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyNetwork,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from jobs.core import policy as tier_policy
from jobs.core.errors import ConfigError
from jobs.core.pools import DEFAULT_POOL, Pools, PoolSpec, pool_prefix
from jobs.core.webhooks import Reach

Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Share = Annotated[float, Field(gt=0, le=1)]

DEFAULT_TIERS: dict[str, dict[str, Any]] = {
    "premium": {"base_priority": 0, "max_wait_s": 5, "tenant_share": 0.25},
    "standard": {"base_priority": 10, "max_wait_s": 20, "tenant_share": 0.10},
    "free": {"base_priority": 20, "max_wait_s": 60, "tenant_share": 0.04},
}

# The admin key creates tenants and reads every key's tenant: a guessable one is an open door.
ADMIN_KEY_MIN_LENGTH = 16
# Compared with letters and digits only, lower-cased: "Change_Me" is "changeme".
ADMIN_KEY_DEFAULTS = frozenset({
    "admin", "administrator", "adminkey", "changeit", "changeme", "default", "example",
    "password", "passw0rd", "placeholder", "replaceme", "secret", "tierq", "tierqadmin",
})
# Words that mark a sample value however long it is ("change-me-to-a-long-key").
ADMIN_KEY_MARKERS = ("changeme", "replaceme", "placeholder", "youradminkey")
_ADMIN_KEY_HINT = ("set it to a long random key, e.g. "
                   "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")


class TierSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_priority: NonNegative
    max_wait_s: Positive
    tenant_share: Share
    queued_share: Share | None = None
    rate_per_s: Positive | None = None
    rate_burst: Annotated[int, Field(ge=1)] | None = None
    # Finished jobs and their results are pruned this long after they finished; 0: never.
    retention_s: NonNegative = tier_policy.DEFAULT_RETENTION_S


class PolicySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ageing_rate_s: Positive = 6.0
    pool_concurrency: Annotated[int, Field(ge=1)] | None = None
    mean_service_s: Positive = 6.0
    service_samples_min: Annotated[int, Field(ge=1)] = 20
    client_timeout_s: Positive | None = None
    lease_ttl_s: Positive = 30.0
    # The dispatcher leader lock's TTL: a standby takes over this long after the leader dies.
    leader_ttl_s: Positive = 5.0
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 3
    retry_backoff_s: NonNegative = 2.0
    retry_backoff_max_s: NonNegative = 300.0
    # Seconds between SIGTERM and SIGKILL when a process is stopped (``tierq up --grace``;
    # set the orchestrator's to the same, e.g. compose's ``stop_grace_period``). A worker
    # hands back, uncharged, the jobs it cannot finish within it.
    stop_grace_s: Annotated[float, Field(gt=0, le=86400)] = 10.0
    # One attempt's run-time limit when neither the job nor its kind names one; a handler
    # still running at its limit is asked to stop, and ``timeout_grace_s`` later the process
    # running it is ended (docs/api.md, "Run-time limit").
    default_timeout_s: Annotated[float, Field(gt=0, le=86400)] = 3600.0
    timeout_grace_s: Annotated[float, Field(gt=0, le=3600)] = 10.0
    # The tiers' arrival rates, which estimates and deadlines count as the better-ranked
    # work that passes a queued job, are the admissions of at most this last window, over
    # the span since each last changed (``jobs.core.arrivals``).
    arrivals_window_s: Annotated[float, Field(ge=5, le=3600)] = 60.0


class PoolSettings(BaseModel):
    """``[pools.<name>]``: the kinds its workers run, and optionally its own capacity (as
    ``policy.pool_concurrency``) and mean service time (as ``policy.mean_service_s``)."""

    model_config = ConfigDict(extra="forbid")

    kinds: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list)
    concurrency: Annotated[int, Field(ge=1)] | None = None
    mean_service_s: Positive | None = None


class KindSettings(BaseModel):
    """``[kinds."<kind>"]``: a deployment's packing of a kind, over its handler's own
    (``jobs.execution.registry.HandlerRegistry.packing``). ``max_items_per_run = 1`` turns
    packing off; ``max_cost_per_run`` is in the units of the handler's ``cost(payload)``."""

    model_config = ConfigDict(extra="forbid")

    max_items_per_run: Annotated[int, Field(ge=1)] | None = None
    max_cost_per_run: Annotated[int, Field(ge=1)] | None = None


class ApiSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_body_bytes: Annotated[int, Field(ge=1024)] = 1024 * 1024
    # ``POST /v1/documents`` takes files up to this size (the multipart body, all told).
    max_document_bytes: Annotated[int, Field(ge=1024)] = 20 * 1024 * 1024
    # Bodies of POST /v1/batches: a batch is many payloads in one request.
    max_batch_body_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024 * 1024
    # The whole body of a POST /v1/batches arrives within this, or the upload is a 408 and
    # nothing is stored: a client that stalls cannot keep its upload slot for ever.
    batch_body_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    # Batch uploads one tenant may have in flight in one API process; one more is
    # ``429 tenant_limit`` (``limit: "uploads"``), so one tenant's slow uploads leave the
    # process to the others.
    max_concurrent_uploads_per_tenant: Annotated[int, Field(ge=1, le=1000)] = 4


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TIERQ_",
        env_nested_delimiter="__",
        extra="forbid",
        case_sensitive=False,
    )

    # The data directory of ``tierq up``; None: ``./.tierq`` (used only if it holds a system).
    data_dir: Path | None = None
    database_url: str | None = None
    # PostgreSQL connections a process keeps (``jobs.store.engine``): the API's threadpool.
    database_pool_size: Annotated[int, Field(ge=1)] = 40
    redis_url: str | None = None
    broker_url: str | None = None
    # The API's base URL, for the commands that talk HTTP (``tierq submit``, ``tierq jobs``).
    api_url: str | None = None
    admin_key: str | None = None
    # Where uploaded documents live (``jobs.blobs.store``): a directory or any fsspec URL; None:
    # ``blobs`` in the data directory. API and workers must see the same store.
    blob_url: str | None = None
    # A result whose JSON is larger than this is kept in the blob store, and
    # ``GET /v1/jobs/<id>/result`` links to it instead of carrying it.
    result_inline_bytes: Annotated[int, Field(ge=1024)] = 1024 * 1024
    # Storing such a result may take this long; a blob store slower than that (or one that
    # hangs) leaves the result in the job's row instead (``jobs.execution.results``).
    result_store_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    # When a worker runs its handlers' ``setup()`` (load a model): "eager", before it takes a
    # job and registers its slots; "lazy", before the first job of each kind in the process
    # (less memory and a faster start, where a kind's first job may wait for its model).
    worker_setup: Literal["eager", "lazy"] = "eager"
    # Every Redis key tierq writes starts with this; one hash tag keeps them in one slot.
    key_prefix: str = "{tierq}:"
    # Webhooks to loopback, link-local and private addresses (refused by default: a tenant
    # must not make tierq call inside its network); deliveries made at once per process,
    # and per tenant within them (one slow receiver holds up no other tenant).
    webhook_allow_private: bool = False
    # Or only these networks (CIDR, ``["10.20.0.0/16"]``): one internal receiver allowed,
    # every other address inside a network still refused.
    webhook_allow_networks: list[IPvAnyNetwork] = Field(default_factory=list)
    webhook_concurrency: Annotated[int, Field(ge=1, le=256)] = 16
    webhook_tenant_concurrency: Annotated[int, Field(ge=1, le=256)] = 4
    config: Path | None = None

    policy: PolicySettings = PolicySettings()
    api: ApiSettings = ApiSettings()
    tiers: dict[str, TierSettings] = Field(default_factory=dict)
    # ``[pools.<name>]``: which workers run which kinds (``jobs.core.pools``); none: one
    # pool, ``default``, runs every kind.
    pools: dict[str, PoolSettings] = Field(default_factory=dict)
    # The pool this process's worker joins (``tierq worker --pool``).
    pool: str = DEFAULT_POOL
    # ``[kinds."<kind>"]``: per-kind overrides of the handlers' packing (``KindSettings``).
    kinds: dict[str, KindSettings] = Field(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _TomlSource(settings_cls))

    @field_validator("admin_key")
    @classmethod
    def _admin_key_is_not_guessable(cls, key: str | None) -> str | None:
        """Refuse at start what a scanner would try first; an empty value means unset."""
        if not key:
            return None
        bare = "".join(ch for ch in key.lower() if ch.isalnum())
        if bare in ADMIN_KEY_DEFAULTS or any(word in bare for word in ADMIN_KEY_MARKERS):
            raise PydanticCustomError("admin_key", "TIERQ_ADMIN_KEY is a known default or "
                                      "placeholder; " + _ADMIN_KEY_HINT)
        if len(key) < ADMIN_KEY_MIN_LENGTH:
            raise PydanticCustomError("admin_key", f"TIERQ_ADMIN_KEY is {len(key)} characters, "
                                      f"fewer than {ADMIN_KEY_MIN_LENGTH}; " + _ADMIN_KEY_HINT)
        return key

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.tiers:
            raise ValueError("tiers: at least one tier must be configured")
        for name in self.tiers:
            if not name.isidentifier() or name != name.lower():
                raise ValueError(f"tiers.{name!s}: a tier name must be a lower-case identifier")
        if not self.key_prefix.startswith("{") or "}" not in self.key_prefix:
            raise ValueError("key_prefix: must start with one hash tag, e.g. '{tierq}:'")
        pools = self.pool_set()  # raises ValueError naming a bad pool
        if self.pool not in pools.names:
            raise ValueError(f"pool: no pool {self.pool!r} is configured; configured: "
                             f"{', '.join(pools.names)}")
        return self

    def webhook_reach(self) -> Reach:
        """Where webhooks may go (``jobs.core.webhooks.Reach``)."""
        return Reach(allow_private=self.webhook_allow_private,
                     networks=tuple(self.webhook_allow_networks))

    def pool_set(self) -> Pools:
        """The configured pools (``jobs.core.pools``)."""
        return Pools({
            name: PoolSpec(name=name, kinds=frozenset(spec.kinds), concurrency=spec.concurrency,
                           mean_service_s=spec.mean_service_s)
            for name, spec in self.pools.items()
        })

    def pool_prefix(self, name: str | None = None) -> str:
        """The index key prefix of pool ``name`` (None: this process's ``pool``)."""
        return pool_prefix(self.key_prefix, self.pool if name is None else name)

    def pool_policy(self, name: str) -> tier_policy.Policy:
        """The policy with pool ``name``'s own capacity and mean service time, where set.
        ``policy.pool_concurrency`` sizes the default pool only: another pool without its
        own ``concurrency`` is sized by its live workers."""
        base = self.build_policy()
        spec = self.pool_set().spec(name)
        fallback = base.pool_concurrency if name == DEFAULT_POOL else None
        return dataclasses.replace(
            base,
            pool_concurrency=spec.concurrency or fallback,
            mean_service_s=spec.mean_service_s or base.mean_service_s,
        )

    def build_policy(self) -> tier_policy.Policy:
        tiers = {
            name: tier_policy.Tier(name=name, **tier.model_dump())
            for name, tier in self.tiers.items()
        }
        return tier_policy.Policy(tiers=tiers, **self.policy.model_dump())

    def home(self) -> Path:
        """The data directory: the configured one, else ``./.tierq``."""
        return (self.data_dir or Path(DEFAULT_DATA_DIR)).resolve()

    def resolved_database_url(self, *, create: bool = False) -> str:
        """The configured URL, else the SQLite file in the data directory: an existing one,
        or (``create``: ``tierq up``, ``tierq migrate``) a new one."""
        if self.database_url:
            return self.database_url
        path = self.home() / "tierq.db"
        if create:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        elif not path.exists():
            raise ConfigError(
                f"no tierq database found: {self._nothing_at()} has no tierq.db. Set "
                "TIERQ_DATABASE_URL (or database_url in the TIERQ_CONFIG file), or point "
                "--data-dir / TIERQ_DATA_DIR at the data directory of `tierq up`"
            )
        return f"sqlite:///{path}"

    def resolved_redis_url(self) -> str:
        """The configured URL, else the embedded Redis of a running ``tierq up`` (its socket
        in the data directory)."""
        if self.redis_url:
            return self.redis_url
        socket = self.home() / SOCKET_NAME
        if socket.exists():
            return f"unix://{socket}"
        raise ConfigError(
            f"no Redis found: {self._nothing_at()} has no running `tierq up` (no {SOCKET_NAME})."
            " Set TIERQ_REDIS_URL (or redis_url in the TIERQ_CONFIG file), or point "
            "--data-dir / TIERQ_DATA_DIR at the data directory of a running `tierq up`"
        )

    def resolved_broker_url(self) -> str:
        """Celery's broker: the configured one, else the Redis above in kombu's spelling."""
        if self.broker_url:
            return self.broker_url
        url = self.resolved_redis_url()
        if url.startswith("unix://"):
            return "redis+socket://" + url.removeprefix("unix://")
        return url

    def resolved_api_url(self) -> str:
        """The configured API URL, else the one a running ``tierq up`` wrote in its data
        directory (``up.json``)."""
        if self.api_url:
            return self.api_url.rstrip("/")
        running = read_up_file(self.home())
        if running is not None:
            return str(running["api_url"])
        raise ConfigError(
            f"no tierq API found: {self._nothing_at()} has no running `tierq up` (no "
            f"{UP_FILE}). Pass --api URL or set TIERQ_API_URL, or point --data-dir / "
            "TIERQ_DATA_DIR at the data directory of a running `tierq up`"
        )

    def _nothing_at(self) -> str:
        where = "the data directory" if self.data_dir else "the default data directory"
        return f"{where} {self.home()}"

    def describe_target(self, *, database: bool = True, redis: bool = True) -> str:
        """One line naming the system a command acts on (passwords hidden)."""
        parts = []
        if database:
            parts.append(f"database {hide_password(self.resolved_database_url())}")
        if redis:
            parts.append(f"redis {hide_password(self.resolved_redis_url())}")
        return " · ".join(parts)


DEFAULT_DATA_DIR = ".tierq"
SOCKET_NAME = "redis.sock"
# Written by ``tierq up`` into its data directory while it runs: where its API listens.
UP_FILE = "up.json"


def hide_password(url: str) -> str:
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def write_up_file(data_dir: Path, *, api_url: str) -> Path:
    path = data_dir / UP_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"api_url": api_url, "pid": os.getpid()}) + "\n")
    tmp.replace(path)
    return path


def read_up_file(data_dir: Path) -> dict[str, Any] | None:
    """What a running ``tierq up`` wrote; None when there is none or its process is gone."""
    try:
        data = json.loads((data_dir / UP_FILE).read_text())
        pid = int(data["pid"])
        str(data["api_url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    return dict(data)


class _TomlSource(PydanticBaseSettingsSource):
    """The TOML file named by ``TIERQ_CONFIG`` (or ``config=``), plus the default tiers."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ returns the whole mapping at once

    def __call__(self) -> dict[str, Any]:
        # ``config=`` (the CLI's --config) or TIERQ_CONFIG, as read by the sources before this.
        path = self.current_state.get("config") or os.environ.get("TIERQ_CONFIG")
        data: dict[str, Any] = {}
        if path:
            try:
                data = tomllib.loads(Path(path).read_text())
            except OSError as exc:
                raise ValueError(f"config: cannot read {path}: {exc.strerror}") from exc
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"config: {path} is not valid TOML: {exc}") from exc
        if "tiers" not in data:
            data["tiers"] = {name: dict(values) for name, values in DEFAULT_TIERS.items()}
        return data


def load_settings(**overrides: Any) -> Settings:
    """Read and validate the settings; raise ``ConfigError`` naming every bad field."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def describe_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        field = ".".join(str(part) for part in err["loc"]) or "settings"
        lines.append(f"{field}: {err['msg']}")
    return "invalid configuration: " + "; ".join(lines)
