"""`ServeConfig`: how `vlctl serve` listens and what it accepts, in a module without the web
stack (fastapi) or torch, so that `vlctl serve --help` builds its flags from it in a fraction of a
second."""

from __future__ import annotations

import dataclasses

from vlctl.config import opt, validate_config
from vlctl.fsops import VlctlError

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
TEXT_QUERY_CACHE = 4096  # text query embeddings kept per collection


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """How `vlctl serve` listens and what it accepts."""

    host: str = opt("127.0.0.1", "address to bind; anything but 127.0.0.1 / localhost / ::1 needs --token")
    port: int = opt(8765, "TCP port (0: any free port)", ge=0, le=65535)
    token: str | None = opt(None, "a secret every request must carry (Authorization: Bearer TOKEN, or open "
                            "/?token=TOKEN once); also $VLCTL_SERVE_TOKEN")
    max_upload_bytes: int = opt(8 * 2**20, "largest request body in bytes (an uploaded image)", ge=1024, le=2**30)
    max_pixels: int = opt(16_000_000, "largest uploaded image in pixels (width x height), read from its header",
                          ge=1, le=2**31)
    request_timeout: float = opt(30.0, "seconds a request may compute before it is answered 504", gt=0, le=3600)
    workers: int = opt(2, "threads computing requests at once (more wait; under one interpreter lock more "
                          "threads only add switching: 2 measured best on 2 cores)", ge=1, le=256)
    job_workers: int = opt(1, "threads running background jobs (clustering)", ge=1, le=64)
    threads: int = opt(0, "torch / BLAS threads of the process (0: leave as they are)", ge=0, le=1024)
    heavy_process: bool = opt(True, "run explain and clustering in a separate process at lower CPU priority "
                              "(it loads its own copy of the models), so they never delay searches")
    heavy_threads: int = opt(1, "torch threads of that process (0: torch's default; 1 leaves the other cores to "
                             "the searches)", ge=0, le=1024)
    heavy_nice: int = opt(10, "how much lower that process's CPU priority is (os.nice increment): explain and "
                          "clustering yield the cores to search and steer; 0 on a machine busy with other work, "
                          "where a niced worker waits long", ge=0, le=19)
    text_cache: int = opt(TEXT_QUERY_CACHE, "text queries whose embedding each collection keeps (0: run the text tower for "
                          "every query); a repeated query then skips the text tower", ge=0, le=10**7)

    def __post_init__(self) -> None:
        validate_config(self)


def check_bind(config: ServeConfig) -> None:
    """A bind beyond this machine needs a token (the CLI checks it after reading $VLCTL_SERVE_TOKEN)."""
    if config.host not in LOCAL_HOSTS and not config.token:
        raise VlctlError(f"--host {config.host}: binding beyond this machine needs --token (a secret every request "
                         "must carry; or $VLCTL_SERVE_TOKEN)")
