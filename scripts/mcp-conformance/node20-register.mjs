// `node --import` entry: installs node20-hooks.mjs (test harness only).
import { register } from 'node:module';

register('./node20-hooks.mjs', import.meta.url);
