/**
 * The one HTTP mapping of errors: every failure leaves as `{detail}` (spec doc 1 section 7).
 * 5xx bodies never carry internals; the log does.
 */
import { STATUS_CODES, type IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import type { FastifyError, FastifyInstance } from "fastify";
import { platformErrorOf } from "@platform/rpc";

declare module "fastify" {
  interface FastifyContextConfig {
    /** A body past the gateway's limit is this route's 422 `too_large`, not 413 (the config save). */
    tooLargeIs422?: boolean;
    /** Every validation failure of this route (its schema's, the body's bounds, a service's) is 400, not 422 (POST /api/deployments: "400 validation"). */
    invalidIs400?: boolean;
  }
}

function validationMessage(err: FastifyError): string {
  const first = err.validation?.[0];
  if (!first) return err.message;
  const where = `${err.validationContext ?? "request"}${first.instancePath ? first.instancePath.replaceAll("/", ".") : ""}`;
  const params = first.params as Record<string, unknown>;
  if (first.keyword === "required") return `${where}.${String(params.missingProperty)} is required.`;
  if (first.keyword === "additionalProperties") return `${where}.${String(params.additionalProperty)} is not allowed.`;
  if (first.keyword === "enum") return `${where} must be one of ${(params.allowedValues as unknown[]).join(", ")}.`;
  return `${where} ${first.message ?? "is invalid"}.`;
}

/**
 * A request Node's HTTP parser refuses before Fastify sees it (a URL or headers past its limit,
 * a malformed request line) is still answered in the `{detail}` shape, then the connection closes.
 */
export function clientErrorHandler(err: NodeJS.ErrnoException, socket: Socket): void {
  if (err.code === "ECONNRESET" || socket.destroyed || !socket.writable) {
    socket.destroy();
    return;
  }
  const status = err.code === "HPE_HEADER_OVERFLOW" ? 431 : err.code === "ERR_HTTP_REQUEST_TIMEOUT" ? 408 : 400;
  const detail =
    status === 431 ? "The request's URL or headers are too large." : status === 408 ? "The request took too long to arrive." : "Malformed HTTP request.";
  const body = JSON.stringify({ detail });
  socket.end(
    `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  );
}

/** How much of a body too large is read and dropped before it is refused; past it the refusal goes at once. */
const DRAIN_MAX_BYTES = 16 * 1024 * 1024;

/**
 * The rest of a body too large is read and dropped before it is refused: a client still sending
 * it would otherwise meet a closed connection (a broken pipe) instead of the answer. The
 * connection closes after the answer, so it is never read as a next request.
 */
function drainRejectedBody(raw: IncomingMessage): Promise<void> {
  if (raw.readableEnded || raw.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    let seen = 0;
    const done = () => {
      raw.off("data", onData);
      resolve();
    };
    const onData = (chunk: Buffer) => {
      seen += chunk.length;
      if (seen > DRAIN_MAX_BYTES) done();
    };
    raw.on("data", onData);
    raw.once("end", done);
    raw.once("close", done);
    raw.once("error", done);
    raw.resume();
  });
}

export function registerErrorHandling(app: FastifyInstance): void {
  app.setErrorHandler(async (err: FastifyError, request, reply) => {
    const invalid = request.routeOptions.config?.invalidIs400 ? 400 : 422;
    const platform = platformErrorOf(err);
    if (platform) {
      if (platform.status >= 500) request.log.error({ err }, "request failed");
      return reply.code(platform.status === 422 ? invalid : platform.status).send({ detail: platform.detail });
    }
    if (err.validation) {
      return reply.code(invalid).send({
        detail: { code: "invalid_request", message: validationMessage(err), errors: err.validation.map((v) => ({ path: v.instancePath, message: v.message })) },
      });
    }
    switch (err.code) {
      case "FST_ERR_CTP_BODY_TOO_LARGE": {
        await drainRejectedBody(request.raw);
        reply.header("connection", "close");
        // A route whose spec makes "too large" one of its 422 refusals (the config save) says it so.
        if (request.routeOptions.config?.tooLargeIs422) {
          const message = "The request body is larger than the gateway takes; a config is at most 64 KiB.";
          return reply.code(422).send({ detail: { code: "too_large", message, errors: [{ code: "too_large", message }] } });
        }
        return reply.code(413).send({ detail: "Request body is too large." });
      }
      case "FST_ERR_CTP_INVALID_MEDIA_TYPE":
        return reply.code(415).send({ detail: "Unsupported content type; send application/json." });
    }
    if (err.statusCode === 400 || err instanceof SyntaxError) {
      return reply.code(400).send({ detail: `Malformed request: ${err.message}` });
    }
    if (err.statusCode && err.statusCode >= 400 && err.statusCode < 500) {
      return reply.code(err.statusCode).send({ detail: err.message });
    }
    request.log.error({ err }, "unhandled error");
    return reply.code(500).send({ detail: "Internal server error." });
  });

  app.setNotFoundHandler((request, reply) => reply.code(404).send({ detail: "Not Found" }));
}
