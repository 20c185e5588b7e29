#!/usr/bin/env python3
"""Check the framework fixtures in tests/e2e/frameworks against a real PostgreSQL.

For each fixture: initdb a throwaway cluster (as the postgres user, wal_level=logical, on PORT,
socket in a temp dir), run the file as is, then run its DDL, create a test_decoding slot, run its
rows, and rebuild from what the WAL carries the messages a consumer receives per
tests/e2e/frameworks/README.md. Without --write, fail when <name>.expect.json differs; with
--write, (re)write it. The cluster is stopped and deleted afterwards.

usage (as root): scripts/check-framework-fixtures.py PG_BINDIR PORT [--write] [names...]
"""
import json, os, shutil, subprocess, sys, tempfile

FIXDIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e", "frameworks")
NAMES = ["cap", "masstransit", "eventuate", "watermill", "spring-modulith", "debezium", "wolverine", "brighter"]


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


class Cluster:
    def __init__(self, bindir, port):
        self.bindir, self.port = bindir, port
        self.dir = tempfile.mkdtemp(prefix="fwpg-")
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = os.path.join(self.dir, "data")

    def pg(self, tool, *args, **kw):
        return run(["runuser", "-u", "postgres", "--", os.path.join(self.bindir, tool), *args], **kw)

    def start(self):
        self.pg("initdb", "-D", self.data, "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8", stdout=subprocess.DEVNULL)
        self.pg("pg_ctl", "-D", self.data, "-w", "-l", os.path.join(self.dir, "log"), "-o",
                f"-p {self.port} -k {self.dir} -c listen_addresses='' -c wal_level=logical", "start",
                stdout=subprocess.DEVNULL)

    def stop(self):
        self.pg("pg_ctl", "-D", self.data, "-w", "-m", "fast", "stop", stdout=subprocess.DEVNULL)
        shutil.rmtree(self.dir)

    def psql(self, db, sql=None, file=None, extra=()):
        args = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", self.dir, "-p", str(self.port), "-d", db, *extra]
        if file:
            args += ["-f", file]
        else:
            args += ["-c", sql]
        return self.pg(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# ---- test_decoding output parser ------------------------------------------------------------
def parse_ident(s, i):
    if s[i] == '"':
        j, out = i + 1, []
        while True:
            if s[j] == '"':
                if j + 1 < len(s) and s[j + 1] == '"':
                    out.append('"'); j += 2; continue
                return "".join(out), j + 1
            out.append(s[j]); j += 1
    j = i
    while s[j] not in '.[: ':
        j += 1
    return s[i:j], j


def parse_change(line):
    # table <schema>.<name>: INSERT: col[type]:value ...
    assert line.startswith("table "), line
    i = 6
    schema, i = parse_ident(line, i)
    assert line[i] == "."
    table, i = parse_ident(line, i + 1)
    assert line[i:i + 2] == ": ", line[i:i + 20]
    i += 2
    j = line.index(":", i)
    action = line[i:j]
    i = j + 1
    cols = {}
    while i < len(line):
        assert line[i] == " ", (line[i:i + 30])
        name, i = parse_ident(line, i + 1)
        assert line[i] == "["
        j = line.index("]:", i)
        typ = line[i + 1:j]
        i = j + 2
        if line[i] == "'":
            j, out = i + 1, []
            while True:
                if line[j] == "'":
                    if j + 1 < len(line) and line[j + 1] == "'":
                        out.append("'"); j += 2; continue
                    break
                out.append(line[j]); j += 1
            val, i = "".join(out), j + 1
        else:
            j = line.find(" ", i)
            j = len(line) if j < 0 else j
            val, i = line[i:j], j
            if val == "null":
                val = None
        cols[name] = (typ, val)
    return schema, table, action, cols


def decode_changes(raw):
    txs, cur = [], None
    for rec in raw.split(b"\0"):
        if not rec:
            continue
        line = rec.decode("utf-8")
        if line.startswith("BEGIN"):
            cur = []
        elif line.startswith("COMMIT"):
            txs.append(cur); cur = None
        else:
            cur.append(parse_change(line))
    return txs


# ---- JSON helpers ---------------------------------------------------------------------------
def skip_ws(b, i):
    while i < len(b) and b[i] in b" \t\r\n":
        i += 1
    return i


def skip_string(b, i):
    assert b[i:i + 1] == b'"'
    i += 1
    while b[i:i + 1] != b'"':
        i += 2 if b[i:i + 1] == b"\\" else 1
    return i + 1


def skip_value(b, i):
    c = b[i:i + 1]
    if c == b'"':
        return skip_string(b, i)
    if c in (b"{", b"["):
        depth = 0
        while True:
            c = b[i:i + 1]
            if c == b'"':
                i = skip_string(b, i); continue
            if c in (b"{", b"["):
                depth += 1
            elif c in (b"}", b"]"):
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
    j = i
    while j < len(b) and b[j:j + 1] not in (b",", b"}", b"]", b" ", b"\t", b"\r", b"\n"):
        j += 1
    return j


def member_slice(b, key):
    """Byte slice of a top-level member's value, exactly as stored."""
    i = skip_ws(b, 0)
    assert b[i:i + 1] == b"{"
    i = skip_ws(b, i + 1)
    while b[i:i + 1] != b"}":
        k0 = i
        i = skip_string(b, i)
        name = json.loads(b[k0:i])
        i = skip_ws(b, i)
        assert b[i:i + 1] == b":"
        i = skip_ws(b, i + 1)
        v0 = i
        i = skip_value(b, i)
        if name == key:
            return b[v0:i]
        i = skip_ws(b, i)
        if b[i:i + 1] == b",":
            i = skip_ws(b, i + 1)
    raise KeyError(key)


def header_object(text, drop=()):
    if text is None:
        return {}
    obj = json.loads(text, parse_int=str, parse_float=str, object_pairs_hook=list)
    out = {}
    for k, v in obj:
        if k in drop or v is None:
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        assert isinstance(v, str), f"nested header value {k}: {v!r}"
        assert k not in out, f"duplicate header {k}"
        out[k] = v
    return out


def col_bytes(col):
    typ, val = col
    if val is None:
        return b""
    if typ == "bytea":
        assert val.startswith("\\x")
        return bytes.fromhex(val[2:])
    return val.encode("utf-8")


def txt(cols, name):
    return cols[name][1]


# ---- the consumer view per framework (per the research) --------------------------------------
def consumer_view(name, schema, table, cols):
    """None: not the outbox table or filtered out. Else the expect entry."""
    if name == "cap":
        if (schema, table) != ("cap", "published"):
            return None
        content = col_bytes(cols["Content"])
        value = member_slice(content, "Value")
        return dict(event_id=txt(cols, "Id"), subject_source=txt(cols, "Name"),
                    payload=b"" if value == b"null" else value,
                    headers=header_object(member_slice(content, "Headers").decode()))
    if name == "masstransit":
        if (schema, table) != ("public", "OutboxMessage") or txt(cols, "OutboxId") is None:
            return None
        return dict(event_id=txt(cols, "MessageId"), subject_source=txt(cols, "MessageType"),
                    payload=col_bytes(cols["Body"]), headers=header_object(txt(cols, "Headers")))
    if name == "eventuate":
        if (schema, table) != ("eventuate", "message") or txt(cols, "published") != "0":
            return None
        return dict(event_id=txt(cols, "id"), subject_source=txt(cols, "destination"),
                    payload=col_bytes(cols["payload"]), headers=header_object(txt(cols, "headers")))
    if name == "watermill":
        if schema != "public" or not table.startswith("watermill_") or table.startswith("watermill_offsets_"):
            return None
        return dict(event_id=txt(cols, "uuid"), subject_source=None,
                    payload=col_bytes(cols["payload"]), headers=header_object(txt(cols, "metadata")))
    if name == "spring-modulith":
        if (schema, table) != ("public", "event_publication") or txt(cols, "listener_id") != "outbox-relay":
            return None
        return dict(event_id=txt(cols, "id"), subject_source=txt(cols, "event_type"),
                    payload=col_bytes(cols["serialized_event"]), headers={})
    if name == "debezium":
        if (schema, table) != ("public", "outboxevent"):
            return None
        return dict(event_id=txt(cols, "id"), subject_source=txt(cols, "aggregatetype"),
                    payload=col_bytes(cols["payload"]), headers={})
    if name == "wolverine":
        if (schema, table) != ("wolverine", "wolverine_outgoing_envelopes"):
            return None
        return dict(event_id=txt(cols, "id"), subject_source=txt(cols, "message_type"),
                    payload=col_bytes(cols["body"]), headers={})
    if name == "brighter":
        if (schema, table) != ("public", "outbox"):
            return None
        return dict(event_id=txt(cols, "messageid"), subject_source=txt(cols, "topic"),
                    payload=col_bytes(cols["body"]),
                    headers=header_object(txt(cols, "headerbag"), drop=("paramore.brighter.ProducerTopic",)))
    raise ValueError(name)


def check(cl, name, write):
    path = os.path.join(FIXDIR, name + ".sql")
    text = open(path, encoding="utf-8").read()
    assert "\r" not in text
    ddl, sep, rows = text.partition("\n-- @@ rows\n")
    assert sep, f"{name}: no '-- @@ rows' line"
    db = "fx_" + name.replace("-", "_")
    # 1. the file as is, in one psql run
    cl.psql("postgres", f"CREATE DATABASE {db}_whole")
    cl.psql(db + "_whole", file=path)
    # 2. DDL, then a slot, then the rows: what the WAL carries
    cl.psql("postgres", f"CREATE DATABASE {db}")
    tmp = tempfile.mkdtemp(prefix="fx-"); shutil.chown(tmp, "postgres", "postgres")
    for part, body in (("ddl", ddl), ("rows", rows)):
        p = os.path.join(tmp, part + ".sql")
        open(p, "w", encoding="utf-8").write(body)
        if part == "rows":
            cl.psql(db, "SELECT pg_create_logical_replication_slot('fx', 'test_decoding')")
        cl.psql(db, file=p)
    out = cl.psql(db, "SELECT data FROM pg_logical_slot_get_changes('fx', NULL, NULL, 'include-xids', '0', 'skip-empty-xacts', '1')",
                  extra=("-A", "-t", "-0")).stdout
    cl.psql(db, "SELECT pg_drop_replication_slot('fx')")
    shutil.rmtree(tmp)
    txs = decode_changes(out)
    expect, skipped, ids = [], [], set()
    for n, tx in enumerate(txs):
        for schema, table, action, cols in tx:
            if action != "INSERT":
                continue
            v = consumer_view(name, schema, table, cols)
            if v is None:
                skipped.append((n, schema, table))
                continue
            assert v["event_id"] not in ids, f"duplicate id {v['event_id']}"
            ids.add(v["event_id"])
            expect.append(dict(event_id=v["event_id"], subject_source=v["subject_source"],
                               payload_hex=v["payload"].hex(), headers=v["headers"]))
    dest = os.path.join(FIXDIR, name + ".expect.json")
    rendered = json.dumps(expect, indent=2, ensure_ascii=False) + "\n"
    if write:
        open(dest, "w", encoding="utf-8").write(rendered)
    else:
        have = open(dest, encoding="utf-8").read()
        assert have == rendered, f"{name}: {dest} differs from what PostgreSQL stored"
    print(f"{name}: {len(txs)} transactions, {len(expect)} messages, {len(skipped)} inserts not relayed {skipped}")
    return expect


def main():
    bindir, port = sys.argv[1], int(sys.argv[2])
    write = "--write" in sys.argv
    names = [a for a in sys.argv[3:] if not a.startswith("--")] or NAMES
    cl = Cluster(bindir, port)
    cl.start()
    try:
        v = cl.psql("postgres", "SHOW server_version", extra=("-A", "-t")).stdout.decode().strip()
        print("server", v)
        for n in names:
            try:
                check(cl, n, write)
            except subprocess.CalledProcessError as e:
                print(f"{n}: FAILED\n{e.stderr.decode()}")
                raise
    finally:
        cl.stop()


if __name__ == "__main__":
    main()
