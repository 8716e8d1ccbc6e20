import "@platform/service/heap";
import { healthAggregatorEnv, loadConfigOrExit } from "@platform/config";
import { runMain } from "@platform/service";
import { build } from "./app.ts";

const config = loadConfigOrExit(healthAggregatorEnv);
runMain("health-aggregator", () => build(config));
