"""The bulk-load reference for scripts/bench-postgres.sh: psycopg 3's binary COPY with
pgvector's adapter (the fastest common way to load vectors from Python), into one table shaped
like ragline's `chunks` (LIKE ... INCLUDING ALL: the unique id, the document index, the
tsvector and its GIN index, see below) plus the vector column ragline keeps in a table of its own
(`vectors_1`); no HNSW index during the load, as ragline does. The reference only appends: no
upsert, no lifecycle rows, one transaction. Rows of the same shape as ragline's synthetic ones
(src/indexers/synthetic.rs): 90 words from the same list, unit vectors. Prints one JSON
object.

    python bench-postgres.py URL LIKE_SCHEMA CHUNKS [server|none]

`server` (the default): the table's `tsvector` is a generated column, made by PostgreSQL's
`to_tsvector('english', ...)`, with its GIN index maintained during the load (the common way);
`none`: no full-text column at all, the floor of what the server takes for these rows.
"""

import json
import sys
import time

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

WORDS = (
    "render effect state component server cache memo ref context reducer transition suspense "
    "hydrate portal event handler layout stream action form input value props children key "
    "list index"
).split()
DIM = 384


def main() -> None:
    url, like, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    fts = sys.argv[4] if len(sys.argv) > 4 else "server"
    assert fts in ("server", "none"), fts
    rng = np.random.default_rng(7)
    vectors = rng.uniform(-1, 1, size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    words = rng.integers(0, len(WORDS), size=(n, 90))
    texts = [" ".join(WORDS[w] for w in row) for row in words]
    keys = [i.to_bytes(16, "little") for i in range(n)]

    with psycopg.connect(url) as conn:
        register_vector(conn)
        conn.execute("DROP SCHEMA IF EXISTS bench_psycopg CASCADE")
        conn.execute("CREATE SCHEMA bench_psycopg")
        conn.execute(f"CREATE TABLE bench_psycopg.chunks (LIKE {like}.chunks INCLUDING ALL)")
        conn.execute(f"ALTER TABLE bench_psycopg.chunks ADD COLUMN embedding vector({DIM})")
        # ragline's `fts` is a plain column it fills itself; the common way from Python is
        # to have the server make the tsvector: a generated column, as ragline's schema
        # had before version 3. `none`: no full text at all, the floor of this table.
        conn.execute("ALTER TABLE bench_psycopg.chunks DROP COLUMN fts")
        if fts == "server":
            conn.execute(
                "ALTER TABLE bench_psycopg.chunks ADD COLUMN fts tsvector GENERATED ALWAYS AS "
                "(to_tsvector('english', heading_path || ' ' || text)) STORED"
            )
            conn.execute("CREATE INDEX ON bench_psycopg.chunks USING gin (fts)")
        conn.commit()

        started = time.perf_counter()
        with conn.cursor() as cur:
            with cur.copy(
                "COPY bench_psycopg.chunks (id, document_id, ordinal, version, text, "
                "heading_path, start_byte, end_byte, token_count, input_key, embedding) "
                "FROM STDIN WITH (FORMAT BINARY)"
            ) as copy:
                copy.set_types(
                    ["text", "text", "int4", "text", "text", "text", "int8", "int8", "int4",
                     "bytea", "vector"]
                )
                for i in range(n):
                    d = i // 10
                    copy.write_row(
                        (f"doc{d}#{i % 10}", f"doc{d}", i % 10, "v1", texts[i],
                         f"Guide > Section {i % 10}", 0, 600, 120, keys[i], vectors[i])
                    )
        conn.commit()
        seconds = time.perf_counter() - started
        count = conn.execute("SELECT count(*) FROM bench_psycopg.chunks").fetchone()[0]
        assert count == n, (count, n)
        conn.execute("DROP SCHEMA bench_psycopg CASCADE")
        conn.commit()
    print(json.dumps({"chunks": n, "fts": fts, "seconds": seconds, "chunks_per_s": n / seconds}))


if __name__ == "__main__":
    main()
