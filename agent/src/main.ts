import "@platform/service/heap";
import { agentEnv, loadConfigOrExit } from "@platform/config";
import { runMain } from "@platform/service";
import { build } from "./app.ts";

const config = loadConfigOrExit(agentEnv);
runMain("agent", () => build(config));
