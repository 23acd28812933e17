"""The one settings module. Every setting comes from the environment, has a safe
development default and a row in the README's configuration table."""

import ipaddress
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
import redis.exceptions

from quor.lib.env import ConfigurationError, env, envbool, envint, envjson, envlist

BASE_DIR = Path(__file__).resolve().parent.parent

# Development mode: verbose errors, relaxed key requirements. `make dev` turns it on.
DEBUG = envbool("QUOR_DEBUG", False)

# Django's signing key (sessions, CSRF). Never used for stored credentials.
SECRET_KEY = env("QUOR_SECRET_KEY", "django-insecure-development-only-secret-key-change-me")

# Key for encrypted model fields (provider keys, App credentials). Kept apart from
# SECRET_KEY so that rotating SECRET_KEY cannot destroy stored credentials.
QUOR_ENCRYPTION_KEY = env("QUOR_ENCRYPTION_KEY", "")
# The operator API (/api/operator/v1/), for deployment automation: at least 32 characters;
# empty, the operator API answers 401 to everything. To rotate without downtime, move the
# old value to QUOR_OPERATOR_TOKEN_PREVIOUS, accepted until ..._PREVIOUS_UNTIL (ISO 8601).
QUOR_OPERATOR_TOKEN = env("QUOR_OPERATOR_TOKEN", "")
QUOR_OPERATOR_TOKEN_PREVIOUS = env("QUOR_OPERATOR_TOKEN_PREVIOUS", "")
QUOR_OPERATOR_TOKEN_PREVIOUS_UNTIL = env("QUOR_OPERATOR_TOKEN_PREVIOUS_UNTIL", "")
DEVELOPMENT_ENCRYPTION_KEY = "insecure-development-only-encryption-key"
CRYPTOGRAPHY_KEY = QUOR_ENCRYPTION_KEY or DEVELOPMENT_ENCRYPTION_KEY

# Host names this deployment answers to (the host of QUOR_SANDBOX_API_URL is added below).
ALLOWED_HOSTS = envlist("QUOR_ALLOWED_HOSTS", "127.0.0.1,localhost")
# Origins allowed to POST forms (needed behind TLS-terminating proxies).
CSRF_TRUSTED_ORIGINS = envlist("QUOR_CSRF_TRUSTED_ORIGINS", "")

# PostgreSQL. Default: the local server on its Unix socket, database `quor`.
# No persistent connections: under ASGI every request runs on its own thread, and a kept
# connection per thread would exhaust PostgreSQL (Django's advice for async servers).
DATABASES = {"default": dj_database_url.parse(env("DATABASE_URL", "postgresql:///quor"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis: Celery broker, Channels layer, locks and signalling.
REDIS_URL = env("REDIS_URL", "redis://127.0.0.1:6379/0")
# Name of this deployment; labels every runtime instance it creates and names its Redis
# channels.
QUOR_DEPLOYMENT = env("QUOR_DEPLOYMENT", "dev")

INSTALLED_APPS = [
    "quor.apps.QuorAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "django_celery_beat",
    "quor.apps.QuorConfig",
    "sandboxes.apps.SandboxesConfig",
    "apps.apps.QuorAppsConfig",
    "approvals.apps.ApprovalsConfig",
    "webapps.apps.WebappsConfig",
    "egress.apps.EgressConfig",
    "knowledge.apps.KnowledgeConfig",
    "django.contrib.postgres",
]

MIDDLEWARE = [
    "quor.lib.middleware.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "quor.lib.middleware.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "quor.lib.middleware.ApiNotFoundMiddleware",
    "quor.lib.middleware.RequestSizeLimitMiddleware",
    "quor.lib.middleware.DatabaseUnavailableMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "quor.urls"
WSGI_APPLICATION = "quor.wsgi.application"
ASGI_APPLICATION = "quor.asgi.application"

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

AUTH_USER_MODEL = "quor.User"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Password logins go through the lockouts first (quor/lib/login_attempts.py); ModelBackend
# stays listed for the browser sessions it signed in (a session names its backend).
AUTHENTICATION_BACKENDS = [
    "quor.lib.login_attempts.LoginAttemptsBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The web process serves static files straight from the apps (no collectstatic step).
WHITENOISE_USE_FINDERS = True

# HTTPS hardening. Production turns these on (see README, "Production").
SESSION_COOKIE_SECURE = envbool("QUOR_SECURE_COOKIES", not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
# An API URL that names no endpoint is its 404 in the API's format, not a CSRF page.
CSRF_FAILURE_VIEW = "quor.lib.errors.csrf_failure"
SECURE_SSL_REDIRECT = envbool("QUOR_SSL_REDIRECT", False)
# Except the sandbox-facing API: the egress proxy calls it over plain HTTP at
# QUOR_SANDBOX_API_URL, and it accepts only the sandbox credential (no browser login).
SECURE_REDIRECT_EXEMPT = [
    r"^api/v1/runtime/(whoami|sessions/[^/]+/(events|heartbeat|webapps))/$",
    r"^api/v1/runtime/knowledge/search$",
]
SECURE_HSTS_SECONDS = envint("QUOR_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
SECURE_HSTS_PRELOAD = envbool("QUOR_HSTS_PRELOAD", False)
# Set when a TLS-terminating proxy in front sets X-Forwarded-Proto.
if envbool("QUOR_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

# Largest request body the API accepts, in bytes; larger bodies get 413.
QUOR_MAX_REQUEST_BYTES = envint("QUOR_MAX_REQUEST_BYTES", 10 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = QUOR_MAX_REQUEST_BYTES

# daphne processes `manage.py serve_web` runs on its one socket: one core each; by
# default one per CPU, at most 4 (each keeps 4 PostgreSQL connections, and Compose's
# PostgreSQL allows 100 in all).
QUOR_WEB_PROCESSES = envint("QUOR_WEB_PROCESSES", min(4, len(os.sched_getaffinity(0))))

# Items per page of an API list when the request gives no `page_size` (README, "API").
QUOR_API_PAGE_SIZE = envint("QUOR_API_PAGE_SIZE", 50)
# Largest `page_size` an API list honours; a larger one is capped to it.
QUOR_API_MAX_PAGE_SIZE = envint("QUOR_API_MAX_PAGE_SIZE", 200)
# Most entries a workspace directory listing returns; `truncated` says there were more.
QUOR_FILES_LIST_LIMIT = envint("QUOR_FILES_LIST_LIMIT", 1000)
# Most a folder downloaded as one archive may hold (its files' sizes added up), in bytes.
QUOR_FILES_ARCHIVE_MAX_BYTES = envint("QUOR_FILES_ARCHIVE_MAX_BYTES", 200 * 1024 * 1024)
# Company knowledge (knowledge/): the largest file indexed, and how long reading one may take.
QUOR_KNOWLEDGE_MAX_FILE_BYTES = envint("QUOR_KNOWLEDGE_MAX_FILE_BYTES", 25 * 1024 * 1024)
QUOR_KNOWLEDGE_EXTRACT_TIMEOUT_SECONDS = envint("QUOR_KNOWLEDGE_EXTRACT_TIMEOUT_SECONDS", 60)
# Where directory and S3 sources may read (knowledge/locations.py): absolute directories,
# and `bucket/prefix` entries of the file store's S3 server; an entry may be given to one
# organization as `<slug>:<entry>`. Empty refuses the kind: an organization admin creates
# sources and must not reach the server's files.
QUOR_KNOWLEDGE_DIRECTORY_ROOTS = envlist("QUOR_KNOWLEDGE_DIRECTORY_ROOTS", "")
QUOR_KNOWLEDGE_S3_PREFIXES = envlist("QUOR_KNOWLEDGE_S3_PREFIXES", "")
# How often every directory and S3 source is synced.
QUOR_KNOWLEDGE_SYNC_INTERVAL_SECONDS = envint("QUOR_KNOWLEDGE_SYNC_INTERVAL_SECONDS", 900)

# Single sign-on: plain-HTTP identity providers on loopback (the tests' provider).
QUOR_SSO_ALLOW_LOOPBACK = envbool("QUOR_SSO_ALLOW_LOOPBACK", False)
# `host:port` of the DNS server asked for email domains' verification records; empty: the
# system's resolver.
QUOR_DOMAIN_VERIFICATION_DNS_SERVER = env("QUOR_DOMAIN_VERIFICATION_DNS_SERVER", "")

# Abuse controls (README, "Abuse controls"); 0 turns a limit off.
# Password login: failed attempts within the window that lock the account (its email,
# known or not) or the client address, and for how long (seconds).
QUOR_LOGIN_MAX_FAILURES_PER_ACCOUNT = envint("QUOR_LOGIN_MAX_FAILURES_PER_ACCOUNT", 5)
QUOR_LOGIN_MAX_FAILURES_PER_ADDRESS = envint("QUOR_LOGIN_MAX_FAILURES_PER_ADDRESS", 50)
QUOR_LOGIN_FAILURE_WINDOW_SECONDS = envint("QUOR_LOGIN_FAILURE_WINDOW_SECONDS", 15 * 60)
QUOR_LOGIN_LOCKOUT_SECONDS = envint("QUOR_LOGIN_LOCKOUT_SECONDS", 15 * 60)
# Requests to the anonymous sign-in endpoints (password forms, single sign-on's start and
# callback), successful or not, per client address and per account (email) within a
# sliding window of this many seconds; beyond them, 429 with Retry-After.
QUOR_SIGN_IN_RATE_LIMIT_PER_ADDRESS = envint("QUOR_SIGN_IN_RATE_LIMIT_PER_ADDRESS", 60)
QUOR_SIGN_IN_RATE_LIMIT_PER_ACCOUNT = envint("QUOR_SIGN_IN_RATE_LIMIT_PER_ACCOUNT", 10)
QUOR_SIGN_IN_RATE_WINDOW_SECONDS = envint("QUOR_SIGN_IN_RATE_WINDOW_SECONDS", 60)
# Proxies in front of the web process that each append the address they saw to
# X-Forwarded-For; 0: the connection's address is the client's.
QUOR_TRUSTED_PROXY_COUNT = envint("QUOR_TRUSTED_PROXY_COUNT", 0)
# API requests per token (a browser session: per user) and per organization (all its
# members together) within a sliding window of this many seconds; beyond them, 429.
QUOR_API_RATE_LIMIT_PER_TOKEN = envint("QUOR_API_RATE_LIMIT_PER_TOKEN", 1200)
QUOR_API_RATE_LIMIT_PER_ORGANIZATION = envint("QUOR_API_RATE_LIMIT_PER_ORGANIZATION", 6000)
QUOR_API_RATE_WINDOW_SECONDS = envint("QUOR_API_RATE_WINDOW_SECONDS", 60)
# At once, per organization: sandboxes with a runtime (running, starting, waking, going
# to sleep), and sessions whose agent is working or about to (a turn pending or running).
QUOR_ORGANIZATION_MAX_RUNNING_SANDBOXES = envint("QUOR_ORGANIZATION_MAX_RUNNING_SANDBOXES", 50)
QUOR_ORGANIZATION_MAX_OPEN_SESSIONS = envint("QUOR_ORGANIZATION_MAX_OPEN_SESSIONS", 100)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "quor.lib.authentication.ServiceAccountTokenAuthentication",
        "quor.lib.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["quor.lib.permissions.DeclaredPermission"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_SCHEMA_CLASS": "quor.lib.schema.AutoSchema",
    "EXCEPTION_HANDLER": "quor.lib.errors.api_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "quor.lib.pagination.CursorPagination",
    "PAGE_SIZE": QUOR_API_PAGE_SIZE,
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "DEFAULT_THROTTLE_CLASSES": ["quor.lib.throttling.ApiRateThrottle"],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Quor Sandbox API",
    "DESCRIPTION": "Sessions, sandboxes, models and tokens of Quor Sandbox.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # Choice sets that share a field name get names of their own in the schema.
    "ENUM_NAME_OVERRIDES": {
        "KnowledgeSourceKindEnum": "knowledge.models.KnowledgeSource.Kind",
        "SandboxStateEnum": "sandboxes.models.Sandbox.State",
        "ExecRecordStatusEnum": "sandboxes.models.ExecRecord.Status",
        "SharingEnum": "sandboxes.models.Session.Sharing",
    },
    # drf-spectacular's enum names, then every operation's error responses (quor/lib/schema.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "quor.lib.schema.add_error_responses",
    ],
}

CHANNEL_LAYERS = {
    "default": {
        # Redis pub/sub: a session's events cross Redis once per web process that has
        # viewers of it, not once per viewer (docs/performance.md). Delivery is at most
        # once; viewers fill any gap from the database (sandboxes/sessions/consumers.py).
        "BACKEND": "quor.lib.channel_layer.ChannelLayer",
        # A restart of Redis leaves dead connections in the pool: a command that meets one
        # is sent again on a new connection instead of failing a viewer's connect. A
        # publish holds the process's one lock of the layer: a Redis that does not answer
        # may hold it 5 s, not more. The subscription only reads: a connection whose peer
        # vanished without a word (a node lost, NAT forgotten) is found by TCP keepalive
        # and a PING every 15 s, and replaced.
        "CONFIG": {
            # Redis's pub/sub ignores the database number: deployments that share a Redis
            # (or the tests' parallel workers) keep their channels apart by name.
            "prefix": f"asgi:{QUOR_DEPLOYMENT}:",
            "hosts": [
                {
                    "address": REDIS_URL,
                    "socket_timeout": 5,
                    "socket_connect_timeout": 5,
                    "socket_keepalive": True,
                    "socket_keepalive_options": {
                        socket.TCP_KEEPIDLE: 15,
                        socket.TCP_KEEPINTVL: 5,
                        socket.TCP_KEEPCNT: 3,
                        socket.TCP_USER_TIMEOUT: 30_000,
                    },
                    "health_check_interval": 15,
                    "retry_on_error": [redis.exceptions.ConnectionError],
                }
            ],
        },
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ROUTES = {
    "sandboxes.tasks.run_agent_turn": {"queue": "agents"},
    "sandboxes.tasks.*": {"queue": "sandboxes"},
    # Company knowledge: indexing is CPU-heavy (embeddings), so it has a worker of its own
    # and never delays the default queue's short work.
    "knowledge.tasks.*": {"queue": "knowledge"},
}
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Workers and beat keep Quor's log handler (LOGGING: format, redaction); --loglevel still
# sets the level.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "sleep-idle-sandboxes": {"task": "sandboxes.tasks.sleep_idle_sandboxes", "schedule": 60.0},
    "reconcile-sandboxes": {"task": "sandboxes.tasks.reconcile_sandboxes", "schedule": 300.0},
    "refill-pool": {"task": "sandboxes.tasks.refill_pool", "schedule": 30.0},
    "requeue-pending-turns": {"task": "sandboxes.tasks.requeue_pending_turns", "schedule": 60.0},
    "fail-lost-turns": {"task": "sandboxes.tasks.fail_lost_turns", "schedule": 60.0},
    "mark-interrupted-execs": {
        "task": "sandboxes.tasks.mark_interrupted_execs",
        "schedule": 60.0,
    },
    "delete-old-exec-records": {
        "task": "sandboxes.tasks.delete_old_exec_records",
        "schedule": 3600.0,
    },
    "close-lost-tunnels": {"task": "webapps.tasks.close_lost_tunnels", "schedule": 30.0},
    "tend-terminal-recordings": {
        "task": "sandboxes.tasks.tend_terminal_recordings",
        "schedule": 300.0,
    },
    # Starts due scheduled tasks: on the default queue, not behind slow sandbox work;
    # dropped if not picked up within 25 s (django-celery-beat's name for `expires`).
    "run-scheduled-tasks": {
        "task": "sandboxes.tasks.run_scheduled_tasks",
        "schedule": 30.0,
        "options": {"queue": "default", "expire_seconds": 25},
    },
    "expire-stale-approvals": {
        "task": "approvals.tasks.expire_stale_approvals",
        "schedule": 60.0,
    },
    "delete-old-egress-decisions": {
        "task": "egress.tasks.delete_old_egress_decisions",
        "schedule": 3600.0,
    },
    "delete-orphaned-blobs": {"task": "quor.tasks.delete_orphaned_blobs", "schedule": 3600.0},
    "delete-old-audit-entries": {
        "task": "quor.tasks.delete_old_audit_entries",
        "schedule": 3600.0,
    },
    "requeue-stuck-documents": {
        "task": "knowledge.tasks.requeue_stuck_documents",
        "schedule": 300.0,
    },
    "sync-knowledge-sources": {
        "task": "knowledge.tasks.sync_all_sources",
        "schedule": float(QUOR_KNOWLEDGE_SYNC_INTERVAL_SECONDS),
    },
}

# Sandbox backend: `docker` (one host) or `kubernetes`; `memory` for tests only (quor.E006).
QUOR_SANDBOX_BACKEND = env("QUOR_SANDBOX_BACKEND", "docker")
# Kubernetes backend (sandboxes/backends/kubernetes.py; docs/deploy-kubernetes.md).
# Namespace of the sandbox pods and their workspace claims.
QUOR_KUBERNETES_NAMESPACE = env("QUOR_KUBERNETES_NAMESPACE", "quor-sandboxes")
# A kubeconfig file; empty: the pod's own service account (in the cluster).
QUOR_KUBERNETES_KUBECONFIG = env("QUOR_KUBERNETES_KUBECONFIG", "")
# "<namespace>/<name>" of the egress proxy's Service: its cluster IP is pinned in each pod.
QUOR_KUBERNETES_EGRESS_SERVICE = env("QUOR_KUBERNETES_EGRESS_SERVICE", "quor/quor-egress-proxy")
# Addresses allowed to open connections into sandboxes (the web app proxy, workers moving
# workspaces): the cluster's pod network, as an IPv4 CIDR.
QUOR_KUBERNETES_CONTROL_PLANE_CIDR = env("QUOR_KUBERNETES_CONTROL_PLANE_CIDR", "")
# Each sandbox's workspace: a PersistentVolumeClaim of this size and storage class
# (empty: the cluster's default class).
QUOR_KUBERNETES_WORKSPACE_SIZE = env("QUOR_KUBERNETES_WORKSPACE_SIZE", "10Gi")
QUOR_KUBERNETES_STORAGE_CLASS = env("QUOR_KUBERNETES_STORAGE_CLASS", "")
# Disk a sandbox may use outside its workspace (/tmp, its home, logs).
QUOR_KUBERNETES_EPHEMERAL_STORAGE = env("QUOR_KUBERNETES_EPHEMERAL_STORAGE", "2Gi")
# Where sandbox pods may run: a JSON object of node labels, a JSON list of tolerations,
# a RuntimeClass name (empty: the cluster's default runtime; see the guide on gVisor).
QUOR_KUBERNETES_NODE_SELECTOR = envjson("QUOR_KUBERNETES_NODE_SELECTOR", "{}", dict)
QUOR_KUBERNETES_TOLERATIONS = envjson("QUOR_KUBERNETES_TOLERATIONS", "[]", list)
QUOR_KUBERNETES_RUNTIME_CLASS = env("QUOR_KUBERNETES_RUNTIME_CLASS", "")
QUOR_KUBERNETES_IMAGE_PULL_POLICY = env("QUOR_KUBERNETES_IMAGE_PULL_POLICY", "IfNotPresent")
# Sandbox pods in user namespaces (hostUsers: false; Kubernetes 1.33+ with a runtime that
# supports them): the sandbox user is then no one on the node. Off only where unsupported.
QUOR_KUBERNETES_USER_NAMESPACES = envbool("QUOR_KUBERNETES_USER_NAMESPACES", True)
# Seconds a new sandbox pod may take to run with its firewall (image pulls included).
QUOR_KUBERNETES_START_TIMEOUT = envint("QUOR_KUBERNETES_START_TIMEOUT", 180)
# Image every sandbox runs (built locally by `make sandbox-image`).
QUOR_SANDBOX_IMAGE = env("QUOR_SANDBOX_IMAGE", "quor-sandbox:latest")
# Subnet of the dedicated sandbox bridge; its first address is the host (the proxy).
QUOR_SANDBOX_SUBNET = env("QUOR_SANDBOX_SUBNET", "10.231.0.0/16")
# Port of the egress proxy on the sandbox bridge's gateway address.
QUOR_EGRESS_PROXY_PORT = envint("QUOR_EGRESS_PROXY_PORT", 8899)
# Resource limits of each sandbox.
QUOR_SANDBOX_CPUS = float(env("QUOR_SANDBOX_CPUS", "1.0"))
QUOR_SANDBOX_MEMORY_MB = envint("QUOR_SANDBOX_MEMORY_MB", 2048)
QUOR_SANDBOX_PIDS = envint("QUOR_SANDBOX_PIDS", 512)
# Bytes of stdout and of stderr kept from one command; the rest is dropped and flagged.
QUOR_EXEC_OUTPUT_LIMIT = envint("QUOR_EXEC_OUTPUT_LIMIT", 1024 * 1024)
# Timeout of a command when none is given, and the largest one accepted, in seconds.
QUOR_EXEC_DEFAULT_TIMEOUT = envint("QUOR_EXEC_DEFAULT_TIMEOUT", 120)
QUOR_EXEC_MAX_TIMEOUT = envint("QUOR_EXEC_MAX_TIMEOUT", 3600)
# How long the exec journal keeps a command's record, and so its idempotency key.
QUOR_EXEC_JOURNAL_RETENTION_DAYS = envint("QUOR_EXEC_JOURNAL_RETENTION_DAYS", 30)
# How long a terminal's recording (an asciicast file) is kept after the terminal ended.
QUOR_TERMINAL_RECORDING_RETENTION_DAYS = envint("QUOR_TERMINAL_RECORDING_RETENTION_DAYS", 90)
# Most output one terminal may record (bytes); past it the terminal ends, so that
# nothing it shows goes unrecorded.
QUOR_TERMINAL_RECORDING_MAX_BYTES = envint("QUOR_TERMINAL_RECORDING_MAX_BYTES", 64 << 20)
# A running sandbox with no activity for this long is marked idle (seconds).
QUOR_SANDBOX_IDLE_SECONDS = envint("QUOR_SANDBOX_IDLE_SECONDS", 30 * 60)
# Ready, unassigned sandboxes kept per backend (the warm pool), and how long one waits to
# be taken before it is replaced (seconds).
QUOR_SANDBOX_POOL_SIZE = envint("QUOR_SANDBOX_POOL_SIZE", 2)
QUOR_SANDBOX_POOL_MAX_AGE_SECONDS = envint("QUOR_SANDBOX_POOL_MAX_AGE_SECONDS", 6 * 3600)
# Snapshots kept per sandbox (sleep and wake only; older ones are deleted).
QUOR_SNAPSHOT_KEEP = envint("QUOR_SNAPSHOT_KEEP", 2)
# URL at which sandboxes reach Quor's API (through the egress proxy, the one private
# destination always allowed, exact host and port).
QUOR_SANDBOX_API_URL = env("QUOR_SANDBOX_API_URL", "http://127.0.0.1:8000")
# The proxy sends that URL's host as Host: always allowed, so that an operator cannot
# forget it (Django compares the host without its port; IPv6 in brackets).
sandbox_api_host = urlsplit(QUOR_SANDBOX_API_URL).hostname or ""
if sandbox_api_host:
    ALLOWED_HOSTS.append(f"[{sandbox_api_host}]" if ":" in sandbox_api_host else sandbox_api_host)
# Extra private destinations the proxy allows, exact host:port, comma-separated.
QUOR_EGRESS_PRIVATE_ALLOWLIST = envlist("QUOR_EGRESS_PRIVATE_ALLOWLIST", "")
# Destination ports sandboxes may use (private allowlist and the Quor API aside).
QUOR_EGRESS_ALLOWED_PORTS = [int(p) for p in envlist("QUOR_EGRESS_ALLOWED_PORTS", "80,443")]
# Largest request body the proxy accepts from a sandbox; larger ones get 413.
QUOR_EGRESS_MAX_BODY_BYTES = envint("QUOR_EGRESS_MAX_BODY_BYTES", 32 * 1024 * 1024)
# Seconds a proxied connection may stay silent (long model calls and streams).
QUOR_EGRESS_IDLE_TIMEOUT = envint("QUOR_EGRESS_IDLE_TIMEOUT", 600)
# Quor's own address as users' browsers reach it (links sent from other origins).
QUOR_PUBLIC_URL = env("QUOR_PUBLIC_URL", "http://localhost:8000")
# Where generated web apps are served: each app on its own host `<label>.<host of this
# URL>` (never Quor's origin), by `manage.py run_webapp_proxy`. Development: *.localhost,
# which browsers resolve to loopback.
QUOR_WEBAPP_BASE_URL = env("QUOR_WEBAPP_BASE_URL", "http://localhost:8001")
# Address (host:port) `manage.py run_webapp_proxy` listens on; QUOR_WEBAPP_BASE_URL's
# wildcard host (through a TLS-terminating proxy in production) leads there.
QUOR_WEBAPP_PROXY_BIND = env("QUOR_WEBAPP_PROXY_BIND", "127.0.0.1:8001")
# Front proxies (addresses or networks) whose X-Forwarded-For the web app proxy reads for
# a visitor's address (webapps.gate.client_address); from any other peer it is ignored.
QUOR_WEBAPP_TRUSTED_PROXIES = envlist("QUOR_WEBAPP_TRUSTED_PROXIES", "")
for _entry in QUOR_WEBAPP_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_entry, strict=False)
    except ValueError:
        raise ConfigurationError(
            f"QUOR_WEBAPP_TRUSTED_PROXIES: not an address or network: {_entry!r}"
        ) from None
# How often the web app proxy checks open WebSockets' access again (a public link's end is
# pushed to it at once; this catches the rest: sharing, membership, the sandbox).
QUOR_WEBAPP_WEBSOCKET_CHECK_SECONDS = envint("QUOR_WEBAPP_WEBSOCKET_CHECK_SECONDS", 5)
# Seconds a viewer's web app cookie stays valid before a new hand-off from Quor.
QUOR_WEBAPP_COOKIE_SECONDS = envint("QUOR_WEBAPP_COOKIE_SECONDS", 12 * 3600)
# Longest life a public link to a web app may be given, in days.
QUOR_PUBLIC_LINK_MAX_DAYS = envint("QUOR_PUBLIC_LINK_MAX_DAYS", 30)
# Most requests per minute a public link may allow (also its default), across all proxies.
QUOR_PUBLIC_LINK_MAX_REQUESTS_PER_MINUTE = envint("QUOR_PUBLIC_LINK_MAX_REQUESTS_PER_MINUTE", 600)
# Most bytes a public link may serve over its life (also its default), across all proxies.
QUOR_PUBLIC_LINK_MAX_BANDWIDTH_BYTES = envint("QUOR_PUBLIC_LINK_MAX_BANDWIDTH_BYTES", 5 * 1024**3)

# Outgoing mail (Django's SMTP backend): the one-time codes of public links restricted to
# email domains. No host: no mail, and such links cannot be made.
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = env("QUOR_EMAIL_HOST", "")
# The SMTP server's port (587: submission with STARTTLS).
EMAIL_PORT = envint("QUOR_EMAIL_PORT", 587)
# Login at the SMTP server; both empty: none.
EMAIL_HOST_USER = env("QUOR_EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env("QUOR_EMAIL_HOST_PASSWORD", "")
# STARTTLS before the login and the message (off only for a relay on loopback).
EMAIL_USE_TLS = envbool("QUOR_EMAIL_USE_TLS", True)
# The From address of Quor's mail.
DEFAULT_FROM_EMAIL = env("QUOR_EMAIL_FROM", "quor@localhost")
# Seconds an SMTP connection may take before the sending gives up.
EMAIL_TIMEOUT = 10
# Local relay tunnels (`quor tunnel PORT`) open at once across the deployment; 0 turns
# them off (the default: tunnels are opt-in).
QUOR_TUNNELS_MAX = envint("QUOR_TUNNELS_MAX", 0)
# Local relay tunnels one user may have open at once.
QUOR_TUNNELS_PER_USER = envint("QUOR_TUNNELS_PER_USER", 2)
# A tunnel's hard lifetime: it closes then, connected or not.
QUOR_TUNNEL_TTL_SECONDS = envint("QUOR_TUNNEL_TTL_SECONDS", 8 * 3600)
# Largest request body, and largest response body, relayed through a tunnel.
QUOR_TUNNEL_MAX_BODY_BYTES = envint("QUOR_TUNNEL_MAX_BODY_BYTES", 10 * 1024**2)
# Bytes each way a WebSocket through a tunnel may carry before it is closed.
QUOR_TUNNEL_WEBSOCKET_MAX_BYTES = envint("QUOR_TUNNEL_WEBSOCKET_MAX_BYTES", 100 * 1024**2)
# Whether opening a tunnel also needs the operator token (X-Quor-Operator-Token).
QUOR_TUNNEL_REQUIRE_OPERATOR_TOKEN = envbool("QUOR_TUNNEL_REQUIRE_OPERATOR_TOKEN", False)
# Seconds a request parked for the user's approval waits before it fails closed.
QUOR_APPROVAL_TIMEOUT_SECONDS = envint("QUOR_APPROVAL_TIMEOUT_SECONDS", 300)
# Where the proxy keeps its CA (created on first start, then kept).
QUOR_EGRESS_CA_DIR = Path(env("QUOR_EGRESS_CA_DIR", str(BASE_DIR / "var" / "egress-ca")))
# DNS server (host:port) the proxy asks; empty: the system resolver.
QUOR_EGRESS_DNS_SERVER = env("QUOR_EGRESS_DNS_SERVER", "")
# Days egress decisions are kept for audit.
QUOR_EGRESS_AUDIT_RETENTION_DAYS = envint("QUOR_EGRESS_AUDIT_RETENTION_DAYS", 30)
# Days the audit log (administrative and security-relevant changes) is kept.
QUOR_AUDIT_RETENTION_DAYS = envint("QUOR_AUDIT_RETENTION_DAYS", 400)
# Extra CA certificates trusted besides the public CAs: by the sandbox image and by
# the proxy when it verifies upstream servers (for TLS-inspecting corporate proxies).
QUOR_EXTRA_CA_BUNDLE = env("QUOR_EXTRA_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
# Longest an agent turn may run, in seconds; most model calls and tool steps it takes.
QUOR_AGENT_TURN_TIMEOUT = envint("QUOR_AGENT_TURN_TIMEOUT", 3600)
QUOR_AGENT_MAX_STEPS = envint("QUOR_AGENT_MAX_STEPS", 30)
# How often a working agent tells Quor it is alive, in seconds (docs: "Sessions and the agent").
QUOR_AGENT_HEARTBEAT_SECONDS = envint("QUOR_AGENT_HEARTBEAT_SECONDS", 15)
# Attachments of a new session: how many, and how large each may be (bytes).
QUOR_MAX_ATTACHMENTS = envint("QUOR_MAX_ATTACHMENTS", 10)
QUOR_MAX_ATTACHMENT_BYTES = envint("QUOR_MAX_ATTACHMENT_BYTES", 20 * 1024 * 1024)
# Largest prompt or follow-up message, in characters.
QUOR_MAX_PROMPT_CHARS = envint("QUOR_MAX_PROMPT_CHARS", 100_000)
# Largest file upload into a workspace, in bytes (uploads are streamed, not buffered).
QUOR_MAX_UPLOAD_BYTES = envint("QUOR_MAX_UPLOAD_BYTES", 100 * 1024 * 1024)

# The file store: attachments, User Library content, Skill bundles and snapshots. A
# directory by default; an S3-compatible bucket when QUOR_FILE_STORE_S3_BUCKET is set.
QUOR_FILE_STORE_DIR = Path(env("QUOR_FILE_STORE_DIR", str(BASE_DIR / "var" / "files")))
QUOR_FILE_STORE_S3_BUCKET = env("QUOR_FILE_STORE_S3_BUCKET", "")
QUOR_FILE_STORE_S3_ENDPOINT_URL = env("QUOR_FILE_STORE_S3_ENDPOINT_URL", "")
QUOR_FILE_STORE_S3_REGION = env("QUOR_FILE_STORE_S3_REGION", "")
QUOR_FILE_STORE_S3_ACCESS_KEY_ID = env("QUOR_FILE_STORE_S3_ACCESS_KEY_ID", "")
QUOR_FILE_STORE_S3_SECRET_ACCESS_KEY = env("QUOR_FILE_STORE_S3_SECRET_ACCESS_KEY", "")
if QUOR_FILE_STORE_S3_BUCKET:
    QUOR_FILE_STORAGE = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": QUOR_FILE_STORE_S3_BUCKET,
            "endpoint_url": QUOR_FILE_STORE_S3_ENDPOINT_URL or None,
            "region_name": QUOR_FILE_STORE_S3_REGION or None,
            # Empty: boto3's own chain (instance role, AWS_* variables, ~/.aws).
            "access_key": QUOR_FILE_STORE_S3_ACCESS_KEY_ID or None,
            "secret_key": QUOR_FILE_STORE_S3_SECRET_ACCESS_KEY or None,
            # Other S3-compatible servers (MinIO, Ceph, ...) answer on one host name.
            "addressing_style": "path" if QUOR_FILE_STORE_S3_ENDPOINT_URL else None,
        },
    }
else:
    QUOR_FILE_STORAGE = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": QUOR_FILE_STORE_DIR},
    }
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "quor_files": QUOR_FILE_STORAGE,
}

# Log level of Quor's own loggers.
QUOR_LOG_LEVEL = env("QUOR_LOG_LEVEL", "INFO")
# Log lines as `text`, or as `json` (one object a line, with the request or task id).
QUOR_LOG_FORMAT = env("QUOR_LOG_FORMAT", "text")
if QUOR_LOG_FORMAT not in ("text", "json"):
    raise ConfigurationError(f"QUOR_LOG_FORMAT must be text or json, got {QUOR_LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact": {"()": "quor.lib.logs.RedactSecrets"}},
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "quor.lib.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": QUOR_LOG_FORMAT,
            "filters": ["redact"],
        }
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        name: {"level": QUOR_LOG_LEVEL}
        for name in ("quor", "sandboxes", "apps", "approvals", "webapps", "egress")
    },
}
# Port of this process's Prometheus metrics (/metrics); 0: none.
QUOR_METRICS_PORT = envint("QUOR_METRICS_PORT", 0)
QUOR_METRICS_ADDRESS = env("QUOR_METRICS_ADDRESS", "0.0.0.0")  # noqa: S104 (pods are scraped)
