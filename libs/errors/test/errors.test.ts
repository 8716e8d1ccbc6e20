import { describe, it, expect } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { create, toBinary } from "@bufbuild/protobuf";
import { ErrorDetailSchema, type ErrorDetail } from "@platform/proto";
import { INVALID_CREDENTIAL, PlatformError, checkIdPrefix, fromConnectError, scopeRequired, toConnectError, type Detail } from "../src/index.ts";

/** What a client receives: the detail as bytes with its type name, not the in-process object. */
function overTheWire(err: ConnectError): ConnectError {
  const received = new ConnectError(err.rawMessage, err.code, err.metadata);
  received.details = err.details.map((d) => ("desc" in d ? { type: d.desc.typeName, value: toBinary(d.desc, create(d.desc, d.value)) } : d));
  return received;
}

/** A Connect error as a client parses it: details as bytes with their type name. */
function received(message: string, code: Code, ...details: ErrorDetail[]): ConnectError {
  const err = new ConnectError(message, code);
  err.details = details.map((d) => ({ type: ErrorDetailSchema.typeName, value: toBinary(ErrorDetailSchema, d) }));
  return err;
}

function roundTrip(err: PlatformError): PlatformError {
  return fromConnectError(overTheWire(toConnectError(err)));
}

describe("PlatformError over Connect", () => {
  it("keeps status and a string detail", () => {
    const original = PlatformError.notFound("App 'web' not found.");
    const connect = toConnectError(original);
    expect(connect.code).toBe(Code.NotFound);
    expect(connect.rawMessage).toBe("App 'web' not found.");
    const back = roundTrip(original);
    expect(back).toBeInstanceOf(PlatformError);
    expect(back.status).toBe(404);
    expect(back.detail).toBe("App 'web' not found.");
    expect(back.message).toBe("App 'web' not found.");
  });

  it("keeps a refusal object with its extras", () => {
    const detail: Detail = {
      code: "quota_exceeded",
      message: "The group has reached its app limit.",
      limit: 3,
      apps: ["a", "b", "c"],
      nested: { soft: false },
    };
    const back = roundTrip(PlatformError.conflict(detail));
    expect(back.status).toBe(409);
    expect(back.detail).toEqual(detail);
    expect(back.message).toBe("The group has reached its app limit.");
  });

  it("keeps a refusal object without extras", () => {
    const back = roundTrip(PlatformError.invalid({ code: "bad_name", message: "Name is invalid." }));
    expect(back.status).toBe(422);
    expect(back.detail).toEqual({ code: "bad_name", message: "Name is invalid." });
  });

  it.each([400, 401, 403, 404, 409, 413, 422, 428, 429, 500, 502, 503, 504])("keeps status %i", (status) => {
    expect(roundTrip(new PlatformError(status, "x")).status).toBe(status);
  });

  it("maps statuses to the matching Connect codes", () => {
    expect(toConnectError(PlatformError.badRequest("x")).code).toBe(Code.InvalidArgument);
    expect(toConnectError(PlatformError.unauthenticated()).code).toBe(Code.Unauthenticated);
    expect(toConnectError(PlatformError.forbidden("x")).code).toBe(Code.PermissionDenied);
    expect(toConnectError(PlatformError.conflict("x")).code).toBe(Code.FailedPrecondition);
    expect(toConnectError(PlatformError.tooLarge("x")).code).toBe(Code.ResourceExhausted);
    expect(toConnectError(PlatformError.unavailable("x")).code).toBe(Code.Unavailable);
    expect(toConnectError(new PlatformError(504, "x")).code).toBe(Code.DeadlineExceeded);
  });

  it("falls back to the Connect code when the detail carries no status", () => {
    const detail = create(ErrorDetailSchema, { code: "", message: "gone" });
    const back = fromConnectError(received("gone", Code.NotFound, detail));
    expect(back.status).toBe(404);
    expect(back.detail).toBe("gone");
  });

  it("has the spec's texts for 401 and a missing scope", () => {
    expect(roundTrip(PlatformError.unauthenticated()).detail).toBe(INVALID_CREDENTIAL);
    const scope = roundTrip(scopeRequired("admin", "read"));
    expect(scope.status).toBe(403);
    expect(scope.detail).toBe("Scope 'admin' required, you have 'read'");
  });
});

describe("a bare ConnectError", () => {
  const secret = "connect ECONNREFUSED 10.0.0.7:7001 at Pool.acquire (/srv/app/node_modules/pg/lib/index.js:45)";
  it.each([
    [Code.DeadlineExceeded, 504],
    [Code.Unavailable, 503],
    [Code.Internal, 500],
    [Code.Unknown, 500],
    [Code.DataLoss, 500],
  ])("with code %i becomes %i without leaking its message", (code, status) => {
    const back = fromConnectError(new ConnectError(secret, code));
    expect(back).toBeInstanceOf(PlatformError);
    expect(back.status).toBe(status);
    expect(typeof back.detail).toBe("string");
    expect(back.detail).not.toContain("ECONNREFUSED");
    expect(back.message).not.toContain("10.0.0.7");
  });

  it("names what happened in plain words", () => {
    expect(fromConnectError(new ConnectError(secret, Code.DeadlineExceeded)).detail).toBe("A platform service did not answer in time.");
    expect(fromConnectError(new ConnectError(secret, Code.Unavailable)).detail).toBe("A platform service is unavailable.");
    expect(fromConnectError(new ConnectError(secret, Code.Internal)).detail).toBe("Internal server error.");
  });
});

describe("checkIdPrefix", () => {
  it("takes a whole id or 8 or more of its first characters, lowercased", () => {
    expect(checkIdPrefix("0A1B2C3D", "a build id")).toBe("0a1b2c3d");
    expect(checkIdPrefix("0a1b2c3d-0000-4000-8000-000000000000", "a build id")).toBe("0a1b2c3d-0000-4000-8000-000000000000");
  });

  it("refuses with 422 saying what is wrong", () => {
    const refusal = (id: string) => {
      try {
        checkIdPrefix(id, "an action id");
      } catch (err) {
        return { status: (err as PlatformError).status, detail: (err as PlatformError).detail };
      }
      return null;
    };
    expect(refusal("0a1b2c3")).toEqual({ status: 422, detail: "'0a1b2c3' is not an action id: give at least 8 characters." });
    expect(refusal("a".repeat(37))).toEqual({ status: 422, detail: `'${"a".repeat(37)}' is not an action id: an id has at most 36 characters.` });
    expect(refusal("0a1b2c3%")).toEqual({ status: 422, detail: "'0a1b2c3%' is not an action id: use hex digits and hyphens only." });
  });
});
