"""Settings for the Yimi platform.

Everything comes from the environment (django-environ), with an embedded default
that works on a fresh machine: a SQLite file in the data directory, the in-memory
channel layer and in-process task execution. Secrets are read from files in the
secrets directory (default ``/run/secrets``), never from the repository; the Django
``SECRET_KEY`` is generated into the data directory on first start (0600) and kept.
"""

from __future__ import annotations

from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from yimi_project.infra.db_pool import pooled_connection_check
from yimi_project.proxy import public_origin, trusted_networks
from yimi_project.secrets import load_or_create_internal_token, load_or_create_secret_key, read_secret

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DATA_DIR = Path(env.str("YIMI_DATA_DIR", default=str(BASE_DIR / "var"))).resolve()
SECRETS_DIR = Path(env.str("YIMI_SECRETS_DIR", default="/run/secrets"))
try:
    DATA_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
except OSError as exc:  # e.g. the default ./var inside a release's read-only code/
    raise ImproperlyConfigured(
        f"the data directory {DATA_DIR} cannot be created ({exc.strerror}): set YIMI_DATA_DIR to a writable directory"
    ) from exc

SECRET_KEY = read_secret(SECRETS_DIR, "django_secret_key") or load_or_create_secret_key(DATA_DIR)
# Loopback-only internal endpoints (the capability gateway, pack callbacks) require it.
INTERNAL_TOKEN = load_or_create_internal_token(SECRETS_DIR, DATA_DIR)
DEBUG = env.bool("YIMI_DEBUG", default=False)
ALLOWED_HOSTS = env.list("YIMI_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
# The Host the internal listener's clients (pack hosts, Celery workers) send on its Unix socket.
INTERNAL_HOST = "yimi.internal"
ALLOWED_HOSTS = [*ALLOWED_HOSTS, INTERNAL_HOST]
CSRF_TRUSTED_ORIGINS = env.list("YIMI_CSRF_TRUSTED_ORIGINS", default=[])

# --- behind a reverse proxy / TLS (README "Behind a proxy / TLS") -------------------------
# Proxies (addresses or CIDR networks) whose X-Forwarded-For / X-Forwarded-Proto are believed;
# from any other peer both headers are dropped (yimi_project/proxy.py). None by default.
YIMI_TRUSTED_PROXIES = env.list("YIMI_TRUSTED_PROXIES", default=[])
trusted_networks(YIMI_TRUSTED_PROXIES)  # a malformed entry stops the start
# Where the owner and the devices reach Yimi. Its host is served and its origin may POST;
# an https:// URL is THE production switch: HTTPS only (redirect, secure cookies, HSTS).
# Unset (the embedded default): plain http on 127.0.0.1, none of the below.
YIMI_PUBLIC_URL = env.str("YIMI_PUBLIC_URL", default="")
SERVED_OVER_HTTPS = YIMI_PUBLIC_URL.strip().lower().startswith("https://")
if YIMI_PUBLIC_URL:
    _public_host, _public_origin = public_origin(YIMI_PUBLIC_URL)
    ALLOWED_HOSTS = [*ALLOWED_HOSTS, _public_host]
    CSRF_TRUSTED_ORIGINS = [*CSRF_TRUSTED_ORIGINS, _public_origin]
if SERVED_OVER_HTTPS:
    # Believed only from YIMI_TRUSTED_PROXIES: the middleware drops it from anyone else.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    # The container healthcheck and the internal listener speak plain http, not through the front.
    SECURE_REDIRECT_EXEMPT = [r"^api/health/(live/)?$", r"^internal/"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    # HSTS holds for the host on every port, for this long, once a browser that trusts the
    # certificate has seen it. includeSubDomains and preload are on (check --deploy W005/W021):
    # the public host is Yimi's own name; preload only allows a submission to browsers'
    # preload lists, which needs the apex domain. Yimi on an apex whose other subdomains are
    # not all HTTPS: turn both off (and accept those two warnings).
    SECURE_HSTS_SECONDS = env.int("YIMI_HSTS_SECONDS", default=31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("YIMI_HSTS_INCLUDE_SUBDOMAINS", default=True)
    SECURE_HSTS_PRELOAD = env.bool("YIMI_HSTS_PRELOAD", default=True)

INSTALLED_APPS = [
    "daphne",
    "channels",
    "accounts.console.ConsoleAdminConfig",  # Django's admin, its index grouped by the owner's tasks
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served from here (no CDN)
    "accounts",
    "devices",
    "voice",
    "memory",
    "llm",
    "brain",
    "companion",
    "consent",
    "payments",
    "capabilities",
    "workshop",
    "releases",
    "schedules",
    "axes",
]

MIDDLEWARE = [
    # First: everything below (HTTPS redirect, CSRF, rate limits) sees the real client.
    "yimi_project.proxy.TrustedProxyMiddleware",
    # No NUL in a path or query string reaches a view (the JSON guard's rule, jsonbody.py).
    "yimi_project.jsonbody.TextGuardMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # daphne serves no static files; the admin's CSS and JS come from here.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: turns an admin login refused for a lockout into a 429 page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "yimi_project.urls"
ASGI_APPLICATION = "yimi_project.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------
DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{DATA_DIR / 'yimi.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Writers take the lock at BEGIN, so two devices appending to the timeline queue up
    # instead of failing with "database is locked" halfway through a transaction.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 20}
    )
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # One bounded pool of connections per process (psycopg_pool, through Django). ASGI runs
    # each request's sync code on a thread of its own; a request (or a task) borrows a
    # connection and gives it back when it ends, so a burst of requests queues for the pool
    # (up to the pool timeout) instead of opening a connection per thread until PostgreSQL
    # refuses everyone. Every process's pool counts against the server's max_connections:
    # README "Database connections". Django keeps no connection of its own (CONN_MAX_AGE 0).
    # A connection is checked as it leaves the pool by yimi_project.infra.db_pool (a dead one is
    # never handed out) without a round trip per checkout, not by CONN_HEALTH_CHECKS
    # (psycopg_pool's empty query every time): Django's backend with the pool's "check"
    # from the options (yimi_project/infra/postgresql).
    DATABASES["default"]["ENGINE"] = "yimi_project.infra.postgresql"
    _prepare_threshold = env.str("YIMI_DB_PREPARE_THRESHOLD", default="5").strip()
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            # Server-side parameter binding, and psycopg prepares a statement on a connection
            # once it has run there YIMI_DB_PREPARE_THRESHOLD times (Django's default is never):
            # PostgreSQL then neither parses nor plans the hot statements again, which was a
            # third of its CPU per text (issue 14). Empty turns preparing off, for a pooler in
            # transaction mode that cannot carry prepared statements between clients.
            "server_side_binding": env.bool("YIMI_DB_SERVER_SIDE_BINDING", default=True),
            "prepare_threshold": int(_prepare_threshold) if _prepare_threshold else None,
            "pool": {
                "min_size": env.int("YIMI_DB_POOL_MIN_SIZE", default=1),
                "max_size": env.int("YIMI_DB_POOL_MAX_SIZE", default=20),
                "timeout": env.float("YIMI_DB_POOL_TIMEOUT_SECONDS", default=30.0),
                # A failing connection attempt is retried with a doubling delay until this
                # many seconds have passed, then the next request that waits tries again at
                # once: psycopg_pool's 5 minutes left the pool waiting out a 16-66 s delay
                # after a PostgreSQL outage ended, every request failing meanwhile (issue 35).
                "reconnect_timeout": env.float("YIMI_DB_POOL_RECONNECT_SECONDS", default=5.0),
                "check": pooled_connection_check(env.float("YIMI_DB_POOL_CHECK_EVERY_SECONDS", default=10.0)),
            },
        }
    )
else:
    # Keep connections open between requests: connecting costs more than a gateway call.
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("YIMI_DB_CONN_MAX_AGE", default=300)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- redis: channel layer and Celery broker --------------------------------------------
REDIS_URL = env.str("REDIS_URL", default="")
CHANNEL_PREFIX = env.str("YIMI_CHANNEL_PREFIX", default="yimi")
# The channel layer waits for messages with BZPOPMIN blocking 5 s (channels_redis'
# brpop_timeout); redis-py 8 reads with a 5 s socket timeout by default, so an idle receive
# would time out and kill every consumer (1011). A host dict becomes
# ConnectionPool.from_url(address, **rest): the layer's own read timeout, twice the pop.
# Not in REDIS_URL: Celery shares that URL and kombu refuses ?socket_timeout=.
CHANNEL_LAYER_SOCKET_TIMEOUT_SECONDS = 10.0
# Capacity (yimi_project.infra.channel_layers): each socket's inbox holds WS_SOCKET_CAPACITY
# messages (timeline.new coalesced to one); on Redis all sockets of a web process share one
# inbox, sized for WS_SOCKETS_PER_PROCESS of them. What does not fit is logged
# (frame_undelivered) and recovered by the device with sync.
WS_SOCKET_CAPACITY = env.int("YIMI_WS_SOCKET_CAPACITY", default=200)
WS_SOCKETS_PER_PROCESS = env.int("YIMI_WS_SOCKETS_PER_PROCESS", default=500)
# Redis connections the channel layer may have in use at once per process: redis-py's pool
# refuses the 101st by default (MaxConnectionsError), which turned 100 devices connecting at
# once into service_unavailable. Each socket's joins and sends borrow one for a moment; idle
# ones stay open for reuse.
CHANNEL_LAYER_MAX_CONNECTIONS = env.int("YIMI_CHANNEL_LAYER_MAX_CONNECTIONS", default=2 * WS_SOCKETS_PER_PROCESS)
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "yimi_project.infra.channel_layers.RedisChannelLayer",
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT_SECONDS,
                           "max_connections": CHANNEL_LAYER_MAX_CONNECTIONS}],
                "prefix": CHANNEL_PREFIX,
                "capacity": WS_SOCKET_CAPACITY,
                "channel_capacity": {"specific.*": WS_SOCKET_CAPACITY * WS_SOCKETS_PER_PROCESS},
            },
        }
    }
    # Bench-only switch (bench/roundtrip.py --channel-layer stock): channels_redis as shipped,
    # for measuring yimi_project.infra.channel_layers against it. Not a product setting.
    if env.str("YIMI_BENCH_CHANNEL_LAYER", default="") == "stock":
        CHANNEL_LAYERS["default"]["BACKEND"] = "channels_redis.core.RedisChannelLayer"
else:
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "yimi_project.infra.channel_layers.InMemoryChannelLayer", "CONFIG": {"capacity": WS_SOCKET_CAPACITY}}
    }

CELERY_BROKER_URL = REDIS_URL or None
CELERY_TASK_DEFAULT_QUEUE = f"{CHANNEL_PREFIX}-tasks"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A worker is one process whose runs overlap: a thread pool of YIMI_WORKER_RUNS slots, every
# run on the process's one event loop (brain.worker.on_worker_loop; README "Worker").
CELERY_WORKER_POOL = "threads"
CELERY_WORKER_CONCURRENCY = env.int("YIMI_WORKER_RUNS", default=8)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # A task whose worker died (acks late) is delivered again once it has been unacknowledged
    # this long. It must outlast the longest task and the longest countdown (the auto-pay undo
    # window), or a task still running or waiting would be delivered a second time.
    "visibility_timeout": env.int("YIMI_CELERY_VISIBILITY_TIMEOUT_SECONDS", default=3600),
    # Prepended to every Redis key of the task queue (kombu's global_keyprefix), so several
    # instances (or test runs) can share one Redis without restoring each other's tasks.
    "global_keyprefix": env.str("YIMI_CELERY_KEY_PREFIX", default=""),
}
# How often runs left behind are recovered (beat's sweep-runs, the embedded sweeper), and how
# often due reminders fire and unanswered cards and unused authorizations expire.
RUN_RECOVERY_SECONDS = env.float("YIMI_RUN_RECOVERY_SECONDS", default=30.0)
DUE_SWEEP_SECONDS = env.float("YIMI_DUE_SWEEP_SECONDS", default=10.0)
# How often a cold-pack migration round runs (beat's archive-round, the embedded sweeper).
ARCHIVE_ROUND_SECONDS = env.float("YIMI_ARCHIVE_ROUND_SECONDS", default=60.0)
CELERY_BEAT_SCHEDULE = {
    "sweep-runs": {"task": "brain.tasks.sweep_runs", "schedule": RUN_RECOVERY_SECONDS},
    # schedules/tasks.py, under the names they had in brain (queued ones on an installed instance still run)
    "fire-due-reminders": {"task": "brain.tasks.fire_due_reminders", "schedule": DUE_SWEEP_SECONDS},
    "fire-due-schedules": {"task": "brain.tasks.fire_due_schedules", "schedule": DUE_SWEEP_SECONDS},
    "run-due-watches": {"task": "brain.tasks.run_due_watches", "schedule": DUE_SWEEP_SECONDS},
    "expire-consent-cards": {"task": "consent.tasks.expire_cards", "schedule": DUE_SWEEP_SECONDS},
    "expire-payment-authorizations": {"task": "payments.tasks.expire_authorizations", "schedule": DUE_SWEEP_SECONDS},
    "index-timeline-embeddings": {"task": "memory.tasks.index_timeline_embeddings", "schedule": 60.0},
    "regenerate-projections": {"task": "memory.tasks.regenerate_projections", "schedule": 300.0},
    "monitor-packs": {"task": "capabilities.tasks.monitor_packs", "schedule": 300.0},  # pack registry (capabilities/registry/monitor.py)
    "archive-round": {"task": "memory.tasks.archive_round", "schedule": ARCHIVE_ROUND_SECONDS},  # cold packs (memory/archive/cold_store.py)
    # The owner's rollback requests, executed at the next idle moment (releases/requested.py).
    "execute-rollback-requests": {"task": "releases.tasks.execute_rollback_requests", "schedule": 60.0},
}
# Without a broker, runs execute on the web server's event loop, and a sweeper there recovers runs.
YIMI_EMBEDDED_SWEEPER = env.bool("YIMI_EMBEDDED_SWEEPER", default=True)

# --- the brain (OpenAI-compatible Chat Completions) -----------------------------------
FAKE_BRAIN_PORT = env.int("YIMI_FAKE_BRAIN_PORT", default=8765)
# Where ``./yimi up`` serves (daphne -b/-p); ``device_sim``'s default ``--server``.
YIMI_HOST = env.str("YIMI_HOST", default="127.0.0.1")
YIMI_PORT = env.int("YIMI_PORT", default=8000)
# The brain's endpoint, model, key and options are model-role settings (llm.roles), imported
# from YIMI_BRAIN_* / YIMI_VISION_* / YIMI_WORKSHOP_* (and the brain_api_key, vision_api_key,
# workshop_api_key secret files) at the FIRST start only; later starts keep the stored ones.
# Whether the demo brain runs is the stored roles' matter (llm.roles.demo_brain_ports), not the environment's.
BRAIN_HISTORY_ENTRIES = env.int("YIMI_BRAIN_HISTORY_ENTRIES", default=20)
# A run whose utterance is older than this is marked expired instead of answered late.
RUN_STALE_SECONDS = 180
# A running run (or sub-agent task) refreshes its heartbeat this often while it works...
RUN_HEARTBEAT_SECONDS = env.float("YIMI_RUN_HEARTBEAT_SECONDS", default=5.0)
# ...and one whose worker has not sent a heartbeat for this long is taken over.
RUN_HEARTBEAT_STALE_SECONDS = env.int("YIMI_RUN_HEARTBEAT_STALE_SECONDS", default=30)
# A queued run younger than this is assumed to be on its way to a worker.
RUN_QUEUED_GRACE_SECONDS = 10
# A worker shutting down stops taking runs from the run lane (brain.run_lane) and waits this
# long for the runs it has; one cut off later is recovered once its heartbeat goes stale.
RUN_LANE_DRAIN_SECONDS = env.float("YIMI_RUN_LANE_DRAIN_SECONDS", default=60.0)

# --- devices and protocol ---------------------------------------------------------------
PAIRING_CODE_TTL_SECONDS = 600
PAIRING_FAILURES_PER_IP = env.int("YIMI_PAIRING_FAILURES_PER_IP", default=5)
PAIRING_FAILURES_GLOBAL = env.int("YIMI_PAIRING_FAILURES_GLOBAL", default=30)
PAIRING_FAILURE_WINDOW_SECONDS = 600
WS_MAX_FRAME_BYTES = 64 * 1024
WS_MAX_TEXT_CHARS = 8000
WS_AUTH_TIMEOUT_SECONDS = env.float("YIMI_WS_AUTH_TIMEOUT_SECONDS", default=10.0)
# Reply chunks to one device leave at most once per this window (yimi_project.push.ReplyChunks).
REPLY_CHUNK_WINDOW_SECONDS = 0.02
# The Mac relay (devices/mac/relay.py): how long a connected Mac has to take an operation
# (else mac_offline), and to answer it (else mac_timeout; below the pack's platform timeout).
MAC_OP_ACCEPT_SECONDS = env.float("YIMI_MAC_OP_ACCEPT_SECONDS", default=5.0)
MAC_OP_TIMEOUT_SECONDS = env.float("YIMI_MAC_OP_TIMEOUT_SECONDS", default=30.0)
# Redis or the database is down: the socket closes with 1013 and tells the device to wait this long.
WS_RETRY_AFTER_SECONDS = 10
HTTP_SIGNATURE_MAX_SKEW_SECONDS = 300
TIMELINE_PAGE_MAX = 200

# --- web admin, static, i18n ------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Admin login lockout (django-axes; README "Admin login lockout"): after 5 wrong passwords
# for one username from one address, that username is refused from that address for 15
# minutes, the right password too. Attempts are kept in the database (every process sees
# them); the address is REMOTE_ADDR only (yimi_project/login_lockout.py).
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_FAILURE_LIMIT = env.int("YIMI_ADMIN_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = env.int("YIMI_ADMIN_LOGIN_COOLOFF_MINUTES", default=15) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_CLIENT_IP_CALLABLE = "yimi_project.login_lockout.client_address"
AXES_RESET_ON_SUCCESS = True
# Not in the admin (every admin there shows the owner's content to the owner only): lockouts are
# listed and lifted with manage.py axes_list_attempts / axes_reset_*.
AXES_ENABLE_ADMIN = False
LANGUAGE_CODE = "en-us"
TIME_ZONE = env.str("YIMI_TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "static"]
# Without collectstatic (tests, a fresh checkout) whitenoise finds files where they are.
WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.DeviceSignatureAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "EXCEPTION_HANDLER": "yimi_project.api.drf_exception_handler",
    # JSON only, through the one JSON guard (yimi_project/jsonbody.py): no NUL, lone
    # surrogate, NaN or nesting past 32 reaches a view; a form body is 415 invalid_request.
    "DEFAULT_PARSER_CLASSES": ["yimi_project.jsonbody.JSONBodyParser"],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

# The OpenAPI 3 schema of the HTTP API (/api/schema/, browsable at /api/docs/; owner only:
# accounts.schema_views). Only /api/ is described: /internal/ is not the public surface.
SPECTACULAR_SETTINGS = {
    "TITLE": "Yimi HTTP API",
    "DESCRIPTION": "The device and owner HTTP API (docs/protocol.md). Device requests are signed; see the protocol.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "PREPROCESSING_HOOKS": ["accounts.schema_views.public_api_only"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The API takes JSON bodies (docs/protocol.md); the schema names no other media type.
    "PARSER_WHITELIST": ["yimi_project.jsonbody.JSONBodyParser"],
}

YIMI_LOG_FORMAT = env.str("YIMI_LOG_FORMAT", default="text")
if YIMI_LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"YIMI_LOG_FORMAT must be text or json, not {YIMI_LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "yimi_project.logs.JsonFormatter"},
        "text": {"()": "yimi_project.logs.TextFormatter"},
    },
    # One format per output (YIMI_LOG_FORMAT=text|json); "yimi" does not propagate, so the
    # root handler daphne installs does not print each event a second time.
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": YIMI_LOG_FORMAT}},
    "loggers": {
        "yimi": {"handlers": ["console"], "level": env.str("YIMI_LOG_LEVEL", default="INFO"), "propagate": False},
        # httpx logs every request URL at INFO; URLs may carry secrets.
        "httpx": {"level": "WARNING"},
    },
}
AUTH_USER_MODEL = "accounts.User"

EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

# --- capabilities -------------------------------------------------------------------------
YIMI_PACKS_DIR = Path(env.str("YIMI_PACKS_DIR", default=str(BASE_DIR / "packs")))
# Per-pack switches (names, comma-separated): packs whose manifest says
# ``enabled_by_default: false`` (the Mac, the cloud phone, the home) are on only when named in
# YIMI_PACKS_ENABLE; any pack named in YIMI_PACKS_DISABLE is off.
YIMI_PACKS_ENABLE = env.list("YIMI_PACKS_ENABLE", default=[])
YIMI_PACKS_DISABLE = env.list("YIMI_PACKS_DISABLE", default=[])
YIMI_WORKSPACE_DIR = Path(env.str("YIMI_WORKSPACE_DIR", default=str(DATA_DIR / "workspace")))
YIMI_MAIL_DIR = Path(env.str("YIMI_MAIL_DIR", default=str(DATA_DIR / "mail")))
# The internal listener: daphne's Unix socket serving /internal/ (the gateway's HTTP
# interface, pack callbacks). No proxy forwards it; the public listener refuses /internal/.
# Its directory holds nothing else: sandboxed packs that declare a platform_api get it bound.
YIMI_INTERNAL_SOCKET = Path(env.str("YIMI_INTERNAL_SOCKET", default=str(DATA_DIR / "sockets" / "internal.sock")))
YIMI_PACKS_FAKE = env.bool("YIMI_PACKS_FAKE", default=False)  # serve packs' fakes (staging)
# Pack processes run in a bubblewrap sandbox (capabilities/mcp_host/sandbox.py); "none"
# runs them unsandboxed (not for production).
YIMI_PACK_SANDBOX = env.str("YIMI_PACK_SANDBOX", default="bwrap")
# Names the packs' egress proxy resolves from this table before DNS, as JSON
# ({"nas.home": ["192.0.2.10"]}); the addresses are checked like DNS answers (docs/packs.md).
YIMI_PACK_EGRESS_HOSTS = env.json("YIMI_PACK_EGRESS_HOSTS", default={})
# The pack registry (capabilities/registry): checked candidates by content digest, and the
# selection file (published packs online, enable switches) every process's loader reads.
# Not under DATA_DIR/packs, which holds the packs' own writable data directories.
YIMI_PACK_REGISTRY_DIR = Path(env.str("YIMI_PACK_REGISTRY_DIR", default=str(DATA_DIR / "pack-registry")))
# The gateway's three interfaces: in-process by default, or over HTTP on the internal
# listener. decide answers within 3 s or the call is not executed.
YIMI_GATEWAY_OVER_HTTP = env.bool("YIMI_GATEWAY_OVER_HTTP", default=False)
GATEWAY_DECIDE_TIMEOUT_SECONDS = 3.0
PACK_CALL_TIMEOUT_SECONDS = env.float("YIMI_PACK_CALL_TIMEOUT_SECONDS", default=120.0)
# What every pack host may use (capabilities/mcp_host/limits.py, docs/packs.md): processes
# (threads included), memory in MiB, CPU seconds over the host process's life, open files.
# A manifest's ``limits`` block may ask for other values, each at most its ceiling.
YIMI_PACK_LIMITS = {
    "processes": env.int("YIMI_PACK_LIMIT_PROCESSES", default=128),
    "memory_mib": env.int("YIMI_PACK_LIMIT_MEMORY_MIB", default=512),
    "cpu_seconds": env.int("YIMI_PACK_LIMIT_CPU_SECONDS", default=600),
    "open_files": env.int("YIMI_PACK_LIMIT_OPEN_FILES", default=256),
}
YIMI_PACK_LIMIT_CEILINGS = {
    "processes": env.int("YIMI_PACK_LIMIT_CEILING_PROCESSES", default=512),
    "memory_mib": env.int("YIMI_PACK_LIMIT_CEILING_MEMORY_MIB", default=2048),
    "cpu_seconds": env.int("YIMI_PACK_LIMIT_CEILING_CPU_SECONDS", default=3600),
    "open_files": env.int("YIMI_PACK_LIMIT_CEILING_OPEN_FILES", default=4096),
}
# "auto": a cgroup per pack host where one can be made (memory and processes, for the host
# and all it starts); "off": the rlimits alone.
YIMI_PACK_CGROUPS = env.str("YIMI_PACK_CGROUPS", default="auto")
# A host that failed to start is not tried again for this long; calls to its packs are
# refused with pack_unavailable meanwhile.
YIMI_PACK_HOST_RETRY_SECONDS = env.float("YIMI_PACK_HOST_RETRY_SECONDS", default=30.0)

# --- the workshop (workshop/: capability_find, the pack template, sandboxed builds) --------
# Builds' working directories; the offline indexes capability_find searches (JSON files the
# deployer refreshes; format in workshop/find.py, examples in workshop/indexes/).
YIMI_WORKSHOP_DIR = Path(env.str("YIMI_WORKSHOP_DIR", default=str(DATA_DIR / "workshop")))
YIMI_WORKSHOP_SKILL_INDEX = Path(env.str("YIMI_WORKSHOP_SKILL_INDEX", default=str(DATA_DIR / "workshop" / "skills-index.json")))
YIMI_WORKSHOP_MCP_INDEX = Path(env.str("YIMI_WORKSHOP_MCP_INDEX", default=str(DATA_DIR / "workshop" / "mcp-index.json")))
YIMI_WORKSHOP_MAX_ATTEMPTS = env.int("YIMI_WORKSHOP_MAX_ATTEMPTS", default=3)  # build + self-test rounds
YIMI_WORKSHOP_SELFTEST_TIMEOUT_SECONDS = env.float("YIMI_WORKSHOP_SELFTEST_TIMEOUT_SECONDS", default=300.0)

# --- the agent loop -------------------------------------------------------------------------
RUN_TOOL_CALL_BUDGET = 120  # the whole delegation tree, failed validations included
RUN_MILESTONE_EVERY = 20
MAX_ACTIVE_SUBAGENTS = 3
MAX_DELEGATION_DEPTH = 2
# How many characters of the packs' SKILL.md files a sub-agent's system prompt carries.
YIMI_SKILLS_PROMPT_CHARS = env.int("YIMI_SKILLS_PROMPT_CHARS", default=8000)
# The main agent's reply streams through the deterministic checker sentence by sentence
# (brain/runner.py). Only bench/roundtrip.py turns this off, to measure the unchecked path.
YIMI_BENCH_UNCHECKED_REPLIES = env.bool("YIMI_BENCH_UNCHECKED_REPLIES", default=False)

# --- consent and payments ----------------------------------------------------------------------
CONSENT_CARD_TTL_SECONDS = env.int("YIMI_CONSENT_CARD_TTL_SECONDS", default=300)
PAYMENT_CARD_TTL_SECONDS = env.int("YIMI_PAYMENT_CARD_TTL_SECONDS", default=300)
PAYMENT_AUTHORIZATION_SECONDS = 60  # one-shot, valid 60 s
PAYMENT_MAX_REPLACEMENTS = 2  # cards replaced because the checkout amount changed, per intent
PAYMENT_UNLOCK_LEASE_SECONDS = env.int("YIMI_PAYMENT_UNLOCK_LEASE_SECONDS", default=300)
PAYMENT_RECENT_VOICE_REQUEST_SECONDS = env.int("YIMI_PAYMENT_RECENT_VOICE_REQUEST_SECONDS", default=600)
# Voice pay: "付吧" on the phone or glasses for a recent voice request (off by default).
PAYMENTS_VOICE_PAY_ENABLED = env.bool("YIMI_PAYMENTS_VOICE_PAY_ENABLED", default=False)
PAYMENTS_VOICE_PAY_MAX = env.str("YIMI_PAYMENTS_VOICE_PAY_MAX", default="200")
# Small auto-pay with a 5-second undo window (off by default; needs voice pay).
PAYMENTS_AUTOPAY_ENABLED = env.bool("YIMI_PAYMENTS_AUTOPAY_ENABLED", default=False)
PAYMENTS_AUTOPAY_MAX = env.str("YIMI_PAYMENTS_AUTOPAY_MAX", default="50")
PAYMENTS_AUTOPAY_DAILY_MAX = env.str("YIMI_PAYMENTS_AUTOPAY_DAILY_MAX", default="150")
PAYMENTS_AUTOPAY_UNDO_SECONDS = env.int("YIMI_PAYMENTS_AUTOPAY_UNDO_SECONDS", default=5)
PAYMENTS_SAME_PAYEE_WINDOW_SECONDS = 30 * 60

# --- voice (voice/, accounts/voice.py) ---------------------------------------------------
YIMI_LOCAL_CATALOG_FILE = env.str("YIMI_LOCAL_CATALOG_FILE", default="")
# Model prices per provider and model, per million tokens (JSON, format in llm/usage.py); no
# prices ship with Yimi: without this file every cost is recorded as unknown.
YIMI_MODEL_PRICES_FILE = env.str("YIMI_MODEL_PRICES_FILE", default="")
VOICEPRINT_THRESHOLD = env.float("YIMI_VOICEPRINT_THRESHOLD", default=0.65)
# Faces (docs/faces.md): every enrolled person's threshold starts here and only rises; the floor
# 0.5 holds whatever is configured.
FACE_THRESHOLD = env.float("YIMI_FACE_THRESHOLD", default=0.5)
VOICE_REQUEST_WINDOW_SECONDS = env.float("YIMI_VOICE_REQUEST_WINDOW_SECONDS", default=8.0)
VOICE_FOLLOWUP_WINDOW_SECONDS = env.float("YIMI_VOICE_FOLLOWUP_WINDOW_SECONDS", default=8.0)
VOICE_MAX_AUDIO_FRAME_BYTES = 32000
VOICE_TRANSCRIPT_WAIT_SECONDS = 60

# --- memory (memory/) ------------------------------------------------------------------------------
# The embedding model (from the local model catalog) for timeline vector search; empty: keyword only.
YIMI_EMBEDDING_MODEL = env.str("YIMI_EMBEDDING_MODEL", default="")

# --- images from devices (memory/personal/images.py, devices/images.py; docs/protocol.md "Images") -------
IMAGE_MAX_BYTES = env.int("YIMI_IMAGE_MAX_BYTES", default=4 * 1024 * 1024)  # one upload, JPEG or PNG
# Any other HTTP request body (yimi_project/infra/body_limit.py; refused before Django reads it).
MAX_REQUEST_BYTES = env.int("YIMI_MAX_REQUEST_BYTES", default=64 * 1024 * 1024)  # the owner uploads enrollment photos in the console
IMAGE_MAX_SIDE = env.int("YIMI_IMAGE_MAX_SIDE", default=4096)  # width and height, each
IMAGE_UPLOAD_TTL_SECONDS = 600  # an upload no image frame announced is deleted after this
# "看看这是什么" without an ``about`` link uses the device's latest image from this many seconds before.
IMAGE_REQUEST_WINDOW_SECONDS = env.int("YIMI_IMAGE_REQUEST_WINDOW_SECONDS", default=120)
# Disk admission for raw writes (memory/archive/admission.py): free bytes >= reserve + write size, free inodes >= reserve.
DISK_RESERVE_BYTES = env.int("YIMI_DISK_RESERVE_BYTES", default=4 * 1024**3)
DISK_RESERVE_INODES = env.int("YIMI_DISK_RESERVE_INODES", default=500_000)
# The L5 hot store (memory/archive/raw_store.py, docs/memory.md "Raw store (L5)"): where originals go;
# below the warning levels (above the reserve) the owner is told, at most once per interval.
RAW_HOT_ROOT = Path(env.str("YIMI_RAW_HOT_ROOT", default=str(DATA_DIR / "raw")))
DISK_WARN_BYTES = env.int("YIMI_DISK_WARN_BYTES", default=DISK_RESERVE_BYTES + 2 * 1024**3)
DISK_WARN_INODES = env.int("YIMI_DISK_WARN_INODES", default=DISK_RESERVE_INODES + 100_000)
RAW_NOTICE_INTERVAL_SECONDS = env.int("YIMI_RAW_NOTICE_INTERVAL_SECONDS", default=6 * 3600)
# Cold packs on WebDAV (memory/archive/cold_store.py, docs/memory.md "Cold packs"): the collection packs
# go under (empty: no cold storage, hot copies stay), its user; the password is the
# cold_webdav_password file in the secrets directory. Hot copies stay this long after their
# pack verified; pack starts are spaced as if uploads ran at COLD_MAX_UPLOAD_KBPS.
COLD_WEBDAV_URL = env.str("YIMI_COLD_WEBDAV_URL", default="")
COLD_WEBDAV_USER = env.str("YIMI_COLD_WEBDAV_USER", default="yimi")
COLD_HOT_RETENTION_SECONDS = env.float("YIMI_COLD_HOT_RETENTION_SECONDS", default=2 * 86400.0)
COLD_MAX_UPLOAD_KBPS = env.int("YIMI_COLD_MAX_UPLOAD_KBPS", default=2000)
HUD_CARD_MAX_CHARS = 40  # the glasses' short form of a card (devices/hud.py)
# Releases of the platform (releases/, docs/architecture.md flow F5): the root holding the
# release directories and the current/previous pointers; the JSON-lines logs (YIMI_LOG_FORMAT=
# json) whose error/critical lines, or events named here, in the last 5 minutes keep a switch
# waiting; the memory cgroup files (v1 memory.oom_control, v2 memory.events) whose oom_kill
# count rising keeps it waiting too.
YIMI_RELEASES_ROOT = Path(env.str("YIMI_RELEASES_ROOT", default=str(DATA_DIR / "releases")))
YIMI_RELEASE_FAULT_LOGS = env.list("YIMI_RELEASE_FAULT_LOGS", default=[])
YIMI_RELEASE_FAULT_EVENTS = env.list("YIMI_RELEASE_FAULT_EVENTS", default=[])
YIMI_RELEASE_OOM_FILES = env.list("YIMI_RELEASE_OOM_FILES", default=[])
