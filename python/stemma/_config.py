"""Where the client finds its coordinator, token and CA: the same places, in the same
order, as the `stemma` CLI (common/auth.cc, cli/main.cc), so that a notebook on a machine
where the CLI works needs no arguments.

  address  the argument; $STEMMA_COORDINATOR; the current context of the CLI's config file
           ($STEMMA_CONFIG, else ~/.config/stemma/config.yaml); localhost:7070. A context
           named explicitly (Client(context=...), the CLI's --context) beats the environment.
  token    the argument; $STEMMA_TOKEN; the file $STEMMA_TOKEN_FILE; the context's
           token-file; ~/.config/stemma/token when it exists; none
  ca       the argument (a PEM file, or PEM text/bytes); $STEMMA_CA; the context's ca;
           ~/.config/stemma/ca.pem when it exists; none (plaintext)
"""

import ipaddress
import os
import stat

from .errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied

DEFAULT_ADDRESS = "localhost:7070"


def _home_config(name):
    home = os.environ.get("HOME")
    return os.path.join(home, ".config", "stemma", name) if home else ""


def config_path():
    return os.environ.get("STEMMA_CONFIG") or _home_config("config.yaml")


def load_context(name=None):
    """The named context (or the current one) of the CLI's config file as a dict with
    server, ca, token-file, namespace; {} when there is no file or no current context."""
    path = config_path()
    if not path or not os.path.exists(path):
        if name:
            raise NotFound(f"context '{name}': no config file ({path or '$HOME unset'})")
        return {}
    import yaml

    from . import _yaml

    try:
        with open(path, encoding="utf-8") as f:
            config = _yaml.load(f.read()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise InvalidArgument(f"{path}: {e}") from None
    if not isinstance(config, dict):
        raise InvalidArgument(f"{path}: must be a mapping with contexts and current-context")
    wanted = name or config.get("current-context") or config.get("current_context")
    if not wanted:
        return {}
    contexts = config.get("contexts") or []
    if isinstance(contexts, dict):  # {name: {...}} as well as [{name: ...}]
        contexts = [dict(v or {}, name=k) for k, v in contexts.items()]
    for c in contexts:
        if isinstance(c, dict) and c.get("name") == wanted:
            return {k.replace("_", "-"): v for k, v in c.items()}
    raise NotFound(f"{path}: no context named '{wanted}'")


def read_secret_file(path, what="token file"):
    """A token file must be a regular file not readable by group or others (as the CLI
    demands); surrounding whitespace removed."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise NotFound(f"{what}: {path}: no such file") from None
    except OSError as e:
        raise PermissionDenied(f"{what}: {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidArgument(f"{what}: {path}: not a regular file")
    if st.st_mode & 0o077:
        raise PermissionDenied(
            f"{what}: {path} is readable by others (mode {st.st_mode & 0o777:o}): "
            f"chmod 600 {path}")
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


class Settings:
    """Where to connect and with what: address, token ("" none), ca_pem (bytes or None),
    server_name (or None), namespace (the context's, for experiment names; "" none)."""

    def __init__(self, address, token, ca_pem, server_name, namespace):
        self.address, self.token, self.ca_pem = address, token, ca_pem
        self.server_name, self.namespace = server_name, namespace


def _env(name):
    return os.environ.get(name, "").strip()


def _context_token(ctx, context_wins):
    """The token of the environment or the context (an explicit context beats the
    environment, as the CLI's --context does), else ~/.config/stemma/token; "" for none."""
    env_token = _env("STEMMA_TOKEN")
    env_file = _env("STEMMA_TOKEN_FILE")
    context_file = ctx.get("token-file")
    if context_file and (context_wins or not (env_token or env_file)):
        return read_secret_file(os.path.expanduser(context_file))
    if env_token:
        return env_token
    if env_file:
        return read_secret_file(env_file)
    if os.path.exists(_home_config("token")):
        return read_secret_file(_home_config("token"))
    return ""


def _read_ca(ca):
    if not ca:
        return None
    if isinstance(ca, bytes):
        return ca
    if "-----BEGIN" in ca:
        return ca.encode()
    try:
        with open(os.path.expanduser(ca), "rb") as f:
            return f.read()
    except OSError as e:
        raise NotFound(f"CA file: {ca}: {e.strerror}") from None


def resolve(address=None, token=None, ca=None, context=None):
    """Arguments beat the environment, which beats the config file's current context; a
    context named with `context=` beats the environment too (the CLI's rule)."""
    ctx = load_context(context)
    context_wins = bool(context)
    server = ctx.get("server") or ctx.get("coordinator")
    if not address:
        env = _env("STEMMA_COORDINATOR")
        address = (server if server and (context_wins or not env) else env) or DEFAULT_ADDRESS
    if token is None:
        token = _context_token(ctx, context_wins)
    if ca is None:
        env_ca = _env("STEMMA_CA")
        ca = ctx.get("ca") if ctx.get("ca") and (context_wins or not env_ca) else env_ca
        if not ca and os.path.exists(_home_config("ca.pem")):
            ca = _home_config("ca.pem")
    ca_pem = _read_ca(ca)
    if token and ca_pem is None and not is_loopback(address):
        raise FailedPrecondition(
            f"refusing to send a token in clear text to {address}: give the coordinator's CA "
            "with ca= or STEMMA_CA")
    return Settings(address, token or "", ca_pem, _env("STEMMA_TLS_SERVER_NAME") or None,
                    ctx.get("namespace") or "")


def is_loopback(address):
    """True when the host of HOST:PORT is 127.0.0.0/8, ::1, localhost or a unix socket."""
    if address.startswith("unix:"):
        return True
    host = address
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else ""
    elif ":" in host:
        host = host.rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
