import "@platform/service/heap";
import { loadConfigOrExit, serviceEnv } from "@platform/config";
import { runMain } from "@platform/service";
import { build } from "./app.ts";

const config = loadConfigOrExit(serviceEnv("health-aggregator"));
runMain("health-aggregator", () => build(config));
