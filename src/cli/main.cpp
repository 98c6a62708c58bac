#include <CLI/CLI.hpp>
#include <cstdio>

int main(int argc, char** argv) {
    CLI::App app{"quern — LLM inference engine"};
    app.set_version_flag("--version", QUERN_VERSION);
    CLI11_PARSE(app, argc, argv);
    return 0;
}
