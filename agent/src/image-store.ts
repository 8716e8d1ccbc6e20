/**
 * The fleet's image store (ARCHITECTURE section 5): the builder publishes each build's archive to
 * a JetStream object-store bucket, and a host that lacks a tag's archive fetches it from there
 * before it deploys. Each host's own image store (`<imageDir>/<app>/<tag>.tar.gz`) stays the copy
 * a deploy unpacks.
 */
import { randomBytes } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import { mkdir, rename, rm } from "node:fs/promises";
import path from "node:path";
import { Readable } from "node:stream";
import type { ReadableStream as NodeReadableStream } from "node:stream/web";
import { pipeline } from "node:stream/promises";
import { Objm, type ObjectStore } from "@nats-io/obj";
import { subjects, type Bus } from "@platform/bus";

/**
 * How long an image stays in the bucket after it was published. Age rather than size bounds it:
 * an object-store bucket discards new writes when full, so a byte cap would fail the next builds
 * instead of letting old images go. A tag older than this deploys only on a host that still has
 * its archive (retention.ts keeps those of the tags running there and the newest few); elsewhere
 * it must be built again.
 */
const IMAGE_TTL_DAYS = 30;

/** The object of one tag's archive in the bucket. */
export function imageObjectName(app: string, tag: string): string {
  return `${app}/${tag}.tar.gz`;
}

/** Opens the bucket, creating it on first use (its settings are fixed then). */
function imageBucket(bus: Bus): Promise<ObjectStore> {
  return new Objm(bus.js).create(subjects.buckets(bus.prefix).images, {
    description: "Build archives (agent image store)",
    ttl: IMAGE_TTL_DAYS * 24 * 3600 * 1_000_000_000,
  });
}

/** Streams an archive into the bucket, replacing an earlier upload of the same tag. */
export async function publishImage(bus: Bus, app: string, tag: string, file: string): Promise<void> {
  const bucket = await imageBucket(bus);
  await bucket.put({ name: imageObjectName(app, tag) }, Readable.toWeb(createReadStream(file)) as ReadableStream<Uint8Array>);
}

/**
 * Downloads a tag's archive to `file`. It is written beside it under another name and renamed
 * into place once complete and its digest checked, so a deploy never unpacks a partial archive.
 */
export async function fetchImage(bus: Bus, app: string, tag: string, file: string): Promise<void> {
  const bucket = await imageBucket(bus);
  const object = await bucket.get(imageObjectName(app, tag));
  if (!object) throw new Error(`the fleet's image store has no image ${app}:${tag} (it keeps images ${IMAGE_TTL_DAYS} days after their build)`);
  // A failed transfer also errors the data stream, which the pipeline reports; this keeps the
  // same rejection from going unhandled.
  const transfer = object.error.catch((err: unknown) => err);
  await mkdir(path.dirname(file), { recursive: true });
  const partial = `${file}.${randomBytes(4).toString("hex")}.part`;
  try {
    await pipeline(Readable.fromWeb(object.data as NodeReadableStream<Uint8Array>), createWriteStream(partial));
    const err = await transfer;
    if (err) throw err;
    await rename(partial, file);
  } catch (err) {
    await rm(partial, { force: true });
    throw err;
  }
}

/** Deletes tags' archives from the bucket; one that is not there (expired, never published) is no error. */
export async function deleteImages(bus: Bus, app: string, tags: string[]): Promise<void> {
  if (tags.length === 0) return;
  const bucket = await imageBucket(bus);
  for (const tag of tags) {
    if (await bucket.info(imageObjectName(app, tag))) await bucket.delete(imageObjectName(app, tag));
  }
}
