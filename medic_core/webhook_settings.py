"""The `[remediation.webhook]` table: as written (WebhookTable, checked key by key) and as
the sender uses it (WebhookSettings: the secret read, the CA bundle loaded)."""

from __future__ import annotations

import logging
import ssl
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medic_core.config import ConfigError, MedicConfig
from medic_core.per_config import per_config
from medic_core.typed_config import parse_table, setting

log = logging.getLogger("medic.settings")

PREFIX = "remediation.webhook"


@dataclass(frozen=True, kw_only=True)
class WebhookTable:
    """The `[remediation.webhook]` table as written (checked by parse_check_config)."""

    url: str = setting("", doc="https:// URL the events are POSTed to (required)")
    secret: str = setting("", doc="HMAC-SHA256 key; or secret_file")
    secret_file: str = setting("", doc="file holding the key (trailing newline dropped)")
    timeout: float = setting(
        10.0, minimum=0.1, maximum=300, doc="seconds per attempt in all: connect, TLS, answer"
    )
    max_attempts: int = setting(5, minimum=1, maximum=50, doc="attempts per delivery round")
    backoff_base: float = setting(1.0, minimum=0, doc="seconds before the first retry")
    backoff_cap: float = setting(60.0, minimum=0, doc="longest wait between two attempts")
    retry_after_max: float = setting(
        60.0, minimum=0, doc="longest Retry-After the delivery thread waits; longer: a later round"
    )
    ca_file: str = setting("", doc="PEM bundle of the CA(s) to trust instead of the system's")
    verify: bool = setting(True, doc="verify the server's TLS certificate (leave it on)")
    allow_http: bool = setting(
        False, doc="accept a plain http:// url (unencrypted; a trusted network only)"
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        try:
            parts = urllib.parse.urlsplit(self.url)
            hostname, _ = parts.hostname, parts.port  # a bad port raises here
        except ValueError as exc:
            yield "url", f"not a URL: {self.url!r} ({exc})", "use https://host[:port]/path"
            return
        if not self.url:
            yield "url", "missing", "give the receiver's URL, e.g. https://tickets.example/medic"
        elif parts.scheme not in ("http", "https") or not hostname:
            yield "url", f"not an https URL: {self.url!r}", "use https://host[:port]/path"
        elif parts.scheme == "http" and not self.allow_http:
            yield (
                "url",
                f"{self.url!r} is plain http: the events and their evidence would cross the"
                " network unencrypted",
                "use https://, or set allow_http = true for a receiver on a trusted network",
            )
        if bool(self.secret) == bool(self.secret_file):
            yield (
                "secret",
                "give exactly one of secret and secret_file",
                "put the key in a root-only file and set secret_file",
            )
        if self.backoff_cap < self.backoff_base:
            yield "backoff_cap", "is below backoff_base", "raise backoff_cap"
        if self.ca_file and not self.verify:
            yield "ca_file", "set while verify = false", "remove one of them"


@dataclass(frozen=True)
class WebhookSettings:
    url: str
    secret: bytes = field(repr=False)
    timeout: float = 10.0
    max_attempts: int = 5
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    retry_after_max: float = 60.0
    ca_file: Path | None = None
    verify: bool = True
    allow_http: bool = False

    @classmethod
    @per_config
    def from_config(cls, config: MedicConfig) -> WebhookSettings | None:
        """The `[remediation.webhook]` table, or None when there is none (no webhook).
        Raises ConfigError naming the file, the key and the fix."""
        table = config.table("remediation").get("webhook")
        if table is None:
            return None
        return cls.from_table(table, config.source)

    @classmethod
    def from_table(cls, table: Any, source: Path | None = None) -> WebhookSettings:
        if not isinstance(table, Mapping):
            raise ConfigError(source, PREFIX, f"expected a table, got {table!r}", "write [...]")
        raw = parse_table(WebhookTable, table, prefix=PREFIX, source=source)
        secret = raw.secret.encode()
        if raw.secret_file:
            path = Path(raw.secret_file)
            try:
                secret = path.read_bytes().rstrip(b"\r\n")
            except OSError as exc:
                raise ConfigError(
                    source,
                    f"{PREFIX}.secret_file",
                    f"cannot read {path}: {exc.strerror}",
                    "create it (root-only) or fix the path",
                ) from None
            if not secret:
                raise ConfigError(
                    source, f"{PREFIX}.secret_file", f"{path} is empty", "write the key into it"
                )
        ca_file = Path(raw.ca_file) if raw.ca_file else None
        if ca_file is not None:
            try:
                ssl.create_default_context(cafile=str(ca_file))
            except (OSError, ssl.SSLError) as exc:
                problem = getattr(exc, "strerror", None) or str(exc)
                raise ConfigError(
                    source,
                    f"{PREFIX}.ca_file",
                    f"cannot load {ca_file}: {problem}",
                    "give a readable PEM file of CA certificates",
                ) from None
        settings = cls(
            url=raw.url,
            secret=secret,
            timeout=raw.timeout,
            max_attempts=raw.max_attempts,
            backoff_base=raw.backoff_base,
            backoff_cap=raw.backoff_cap,
            retry_after_max=raw.retry_after_max,
            ca_file=ca_file,
            verify=raw.verify,
            allow_http=raw.allow_http,
        )
        if urllib.parse.urlsplit(raw.url).scheme == "http":
            log.warning(
                "%s: %s.url is plain http (allow_http = true): events, evidence and signatures"
                " cross the network unencrypted; use https:// outside a trusted network",
                source or "<defaults>",
                PREFIX,
            )
        return settings

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file is not None else None
        )
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context
