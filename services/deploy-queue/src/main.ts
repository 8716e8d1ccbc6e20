import "@platform/service/heap";
import { deployQueueEnv, loadConfigOrExit } from "@platform/config";
import { runMain } from "@platform/service";
import { build } from "./app.ts";

const config = loadConfigOrExit(deployQueueEnv);
runMain("deploy-queue", () => build(config));
