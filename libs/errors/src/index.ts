/**
 * The one error type of the platform. Domain code throws `PlatformError`; RPC carries it as a
 * Connect error with an `ErrorDetail`; the gateway turns it back into the spec's `{detail}` body.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { ErrorDetailSchema } from "@platform/proto";

/** A plain sentence, or a refusal object a client may branch on (spec doc 1 section 7). */
export type Detail = string | ({ code: string; message: string } & Record<string, unknown>);

export class PlatformError extends Error {
  readonly status: number;
  readonly detail: Detail;

  constructor(status: number, detail: Detail) {
    super(typeof detail === "string" ? detail : detail.message);
    this.name = "PlatformError";
    this.status = status;
    this.detail = detail;
  }

  static badRequest(detail: Detail): PlatformError {
    return new PlatformError(400, detail);
  }
  static unauthenticated(detail: Detail = INVALID_CREDENTIAL): PlatformError {
    return new PlatformError(401, detail);
  }
  static forbidden(detail: Detail): PlatformError {
    return new PlatformError(403, detail);
  }
  static notFound(detail: Detail): PlatformError {
    return new PlatformError(404, detail);
  }
  static conflict(detail: Detail): PlatformError {
    return new PlatformError(409, detail);
  }
  static tooLarge(detail: Detail): PlatformError {
    return new PlatformError(413, detail);
  }
  static invalid(detail: Detail): PlatformError {
    return new PlatformError(422, detail);
  }
  static unavailable(detail: Detail): PlatformError {
    return new PlatformError(503, detail);
  }
}

/** The one 401 text of the spec (doc 1 section 5). */
export const INVALID_CREDENTIAL = "Invalid or revoked API key";

/** The spec's 403 text for an insufficient scope. */
export function scopeRequired(required: string, actual: string): PlatformError {
  return PlatformError.forbidden(`Scope '${required}' required, you have '${actual}'`);
}

const ID_PREFIX = /^[0-9a-f-]{8,36}$/i;

/** An id, or its prefix of at least 8 hex-or-hyphen characters (spec doc 1 section 8). */
export function isIdPrefix(id: string): boolean {
  return ID_PREFIX.test(id);
}

/** The id prefix lowercased; 422 saying what is wrong with it otherwise. `noun`: "a build id". */
export function checkIdPrefix(id: string, noun: string): string {
  if (isIdPrefix(id)) return id.toLowerCase();
  const why = id.length < 8 ? "give at least 8 characters" : id.length > 36 ? "an id has at most 36 characters" : "use hex digits and hyphens only";
  throw PlatformError.invalid(`'${id}' is not ${noun}: ${why}.`);
}

const CODE_BY_STATUS: Record<number, Code> = {
  400: Code.InvalidArgument,
  401: Code.Unauthenticated,
  403: Code.PermissionDenied,
  404: Code.NotFound,
  409: Code.FailedPrecondition,
  413: Code.ResourceExhausted,
  422: Code.InvalidArgument,
  428: Code.FailedPrecondition,
  429: Code.ResourceExhausted,
  500: Code.Internal,
  502: Code.Unavailable,
  503: Code.Unavailable,
  504: Code.DeadlineExceeded,
};

const STATUS_BY_CODE: Partial<Record<Code, number>> = {
  [Code.InvalidArgument]: 422,
  [Code.Unauthenticated]: 401,
  [Code.PermissionDenied]: 403,
  [Code.NotFound]: 404,
  [Code.AlreadyExists]: 409,
  [Code.FailedPrecondition]: 409,
  [Code.Aborted]: 409,
  [Code.ResourceExhausted]: 429,
  [Code.Unavailable]: 503,
  [Code.DeadlineExceeded]: 504,
};

export function toConnectError(err: PlatformError): ConnectError {
  const { code, message, ...extras } =
    typeof err.detail === "string" ? { code: "", message: err.detail } : err.detail;
  const detail = create(ErrorDetailSchema, {
    code,
    message,
    extrasJson: Object.keys(extras).length > 0 ? JSON.stringify(extras) : "",
    httpStatus: err.status,
  });
  return new ConnectError(message, CODE_BY_STATUS[err.status] ?? Code.Unknown, undefined, [
    { desc: ErrorDetailSchema, value: detail },
  ]);
}

/**
 * Rebuilds the platform error a service raised. A Connect error without a detail (a dead
 * service, a deadline) becomes a 503/504 whose text does not leak internals.
 */
export function fromConnectError(err: ConnectError): PlatformError {
  const [detail] = err.findDetails(ErrorDetailSchema);
  if (detail) {
    const body: Detail = detail.code
      ? { code: detail.code, message: detail.message, ...(detail.extrasJson ? JSON.parse(detail.extrasJson) : {}) }
      : detail.message;
    return new PlatformError(detail.httpStatus || STATUS_BY_CODE[err.code] || 500, body);
  }
  if (err.code === Code.DeadlineExceeded) return new PlatformError(504, "A platform service did not answer in time.");
  if (err.code === Code.Unavailable) return new PlatformError(503, "A platform service is unavailable.");
  if (err.code === Code.Canceled) return new PlatformError(503, "The request was cancelled.");
  return new PlatformError(500, "Internal server error.");
}
