// commands.h: one entry point per subcommand; each parses its own flags, returns a process exit code.
#ifndef SHARDLM_CLI_COMMANDS_H
#define SHARDLM_CLI_COMMANDS_H

int cmd_prepare(int argc, char **argv);   // src/cli/prepare.c
int cmd_train(int argc, char **argv);     // src/cli/train.c
int cmd_generate(int argc, char **argv);  // src/cli/generate.c
int cmd_convert(int argc, char **argv);   // src/cli/convert.c
int cmd_merge(int argc, char **argv);     // src/cli/merge.c
int cmd_quantize(int argc, char **argv);  // src/cli/quantize.c
int cmd_launch(int argc, char **argv);    // src/cli/launch.c
int cmd_report(int argc, char **argv);    // src/cli/report.c

#endif
