import "@platform/service/heap";
import { agentEnv, loadConfigOrExit } from "@platform/config";
import { runMain } from "@platform/service";
import { build } from "./app.ts";
import { closeInheritedDescriptors } from "./inherited-descriptors.ts";

// Before anything is started: tenant code must not inherit them.
closeInheritedDescriptors();
const config = loadConfigOrExit(agentEnv);
runMain("agent", () => build(config));
