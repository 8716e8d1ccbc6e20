/**
 * The fleet's image store on the machine's real NATS: an archive published by one host is fetched
 * byte for byte by another, and a missing image fails without leaving a file behind.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { randomBytes } from "node:crypto";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createLogger } from "@platform/logger";
import { connectBus, subjects, type Bus } from "@platform/bus";
import { deleteBusStreams, testNatsUrl, uniquePrefix } from "@platform/testing";
import { deleteImages, fetchImage, imageObjectName, publishImage } from "../src/image-store.ts";

const logger = createLogger({ service: "agent-image-store-test", level: "silent", pretty: false });
const prefix = uniquePrefix("timages");
let bus: Bus;
let dir: string;

beforeAll(async () => {
  bus = await connectBus({ url: testNatsUrl(), name: "agent-image-store-test", prefix, logger });
  dir = await mkdtemp(path.join(os.tmpdir(), "agent-image-store-"));
});

afterAll(async () => {
  await bus?.close();
  await deleteBusStreams(prefix);
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe("image store", () => {
  it("names an image by app and tag", () => {
    expect(imageObjectName("shop", "main-0123456789ab")).toBe("shop/main-0123456789ab.tar.gz");
  });

  it("fetches what was published, byte for byte, into a store that lacks it", async () => {
    const archive = randomBytes(1024 * 1024 + 123);
    await writeFile(path.join(dir, "built.tar.gz"), archive);
    await publishImage(bus, "shop", "main-abc", path.join(dir, "built.tar.gz"));

    const fetched = path.join(dir, "deployer", "shop", "main-abc.tar.gz");
    await fetchImage(bus, "shop", "main-abc", fetched);
    expect((await readFile(fetched)).equals(archive)).toBe(true);
    // Only the archive itself: the partial download was renamed into place.
    expect(await readdir(path.dirname(fetched))).toEqual(["main-abc.tar.gz"]);

    const info = await bus.jsm.streams.info(`OBJ_${subjects.buckets(prefix).images}`);
    expect(info.config.max_age).toBe(30 * 24 * 3600 * 1_000_000_000);
  });

  it("fails clearly on an image nobody published and leaves no file behind", async () => {
    const target = path.join(dir, "missing", "shop", "main-nope.tar.gz");
    await expect(fetchImage(bus, "shop", "main-nope", target)).rejects.toThrow("the fleet's image store has no image shop:main-nope");
    expect(await readdir(path.join(dir, "missing")).catch(() => [])).toEqual([]);
  });

  it("deletes the named tags only (undeploy with purge), and a tag that is not there is no error", async () => {
    await writeFile(path.join(dir, "a.tar.gz"), "a");
    await publishImage(bus, "cart", "main-1", path.join(dir, "a.tar.gz"));
    await publishImage(bus, "cart", "dev-1", path.join(dir, "a.tar.gz"));
    await deleteImages(bus, "cart", ["main-1", "main-never"]);
    await expect(fetchImage(bus, "cart", "main-1", path.join(dir, "m.tar.gz"))).rejects.toThrow("has no image cart:main-1");
    await fetchImage(bus, "cart", "dev-1", path.join(dir, "d.tar.gz"));
    expect(await readFile(path.join(dir, "d.tar.gz"), "utf8")).toBe("a");
  });

  it("fails a publish of an archive that is not there, leaving the tag absent", async () => {
    await expect(publishImage(bus, "shop", "main-gone", path.join(dir, "no-such.tar.gz"))).rejects.toThrow(/ENOENT/);
    await expect(fetchImage(bus, "shop", "main-gone", path.join(dir, "gone.tar.gz"))).rejects.toThrow("has no image shop:main-gone");
  });
});

describe("test cleanup", () => {
  it("deleteBusStreams removes the prefix's image bucket too", async () => {
    const other = uniquePrefix("timages");
    const otherBus = await connectBus({ url: testNatsUrl(), name: "agent-image-store-test", prefix: other, logger });
    try {
      await writeFile(path.join(dir, "small.tar.gz"), randomBytes(16));
      await publishImage(otherBus, "shop", "main-1", path.join(dir, "small.tar.gz"));
    } finally {
      await otherBus.close();
    }
    await deleteBusStreams(other);
    const left: string[] = [];
    for await (const name of bus.jsm.streams.names()) if (name.includes(other)) left.push(name);
    expect(left).toEqual([]);
  });
});
