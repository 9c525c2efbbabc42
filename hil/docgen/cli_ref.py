"""CLI reference generated from the click commands: the `hil` group (hil/cli.py `main`, with the
subcommands it finds in hil/commands/) walked recursively, every command with its usage line,
its help text, its arguments and every option (flags, type, default, whether required, help),
as click itself knows them. A command added to hil/commands/ appears here without editing the
docs."""
from __future__ import annotations

import click


def walk(group: click.Command, prefix: str = "hil") -> list[tuple[str, click.Command]]:
    """(full command path, command) for `group` and every command below it, depth first, in
    the order `hil --help` lists them."""
    out = [(prefix, group)]
    if isinstance(group, click.Group):
        ctx = click.Context(group, info_name=prefix)
        for name in group.list_commands(ctx):
            sub = group.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                out.extend(walk(sub, f"{prefix} {name}"))
    return out


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell (one line, pipes escaped)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _type_text(param: click.Parameter) -> str:
    t = param.type
    if isinstance(t, click.Choice):
        return " \\| ".join(f"`{c}`" for c in t.choices)
    if getattr(param, "is_flag", False) and not getattr(param, "secondary_opts", None):
        return "flag"
    if getattr(param, "is_flag", False):
        return "switch"
    name = {click.Path: "path", click.File: "file"}.get(type(t), getattr(t, "name", "text")) or "text"
    return name.lower()


def _default_text(param: click.Parameter, ctx: click.Context) -> str:
    """The default as the command sees it (click's own `get_default`), '' when there is none."""
    if param.required:
        return "**required**"
    default = param.get_default(ctx, call=False)
    if callable(default) or type(default).__name__ == "Sentinel":
        return ""
    if getattr(param, "is_flag", False) and not getattr(param, "secondary_opts", None):
        return "on" if default else "off"
    if default is None or default == () or default == []:
        return ""
    if isinstance(default, bool) and getattr(param, "secondary_opts", None):
        return param.opts[0] if default else param.secondary_opts[0]
    return f"`{default}`"


def _options_table(cmd: click.Command, ctx: click.Context) -> list[str]:
    rows = []
    for p in cmd.params:
        if not isinstance(p, click.Option) or p.hidden:
            continue
        flags = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
        meta = f" `{p.metavar}`" if p.metavar else ""
        repeat = " (repeatable)" if p.multiple else ""
        rows.append(f"| {flags}{meta} | {_type_text(p)} | {_default_text(p, ctx)} | {_cell(p.help or '')}{repeat} |")
    rows.append("| `--help` | flag | | Show the command's help and exit. |")
    return ["| option | type | default | description |", "| --- | --- | --- | --- |", *rows]


def command_markdown(path: str, cmd: click.Command) -> str:
    """One command's section: heading, usage, help text, arguments, options, subcommands."""
    ctx = click.Context(cmd, info_name=path)
    depth = min(2 + path.count(" "), 4)
    lines = [f"{'#' * depth} `{path}`", ""]
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    lines += ["```", f"Usage: {path} {usage}".rstrip(), "```", ""]
    if cmd.help:
        lines += [click.unstyle(cmd.help).split("\f")[0].strip(), ""]
    args = [p for p in cmd.params if isinstance(p, click.Argument)]
    if args:
        lines.append("Arguments: " + ", ".join(
            f"`{p.human_readable_name}`" + ("" if p.required else " (optional)") + (" (one or more)" if p.nargs == -1 else "")
            for p in args) + ".")
        lines.append("")
    if isinstance(cmd, click.Group):
        subs = [(n, cmd.get_command(ctx, n)) for n in cmd.list_commands(ctx)]
        lines += ["| subcommand | what it does |", "| --- | --- |"]
        lines += [f"| [`{path} {n}`](#{_anchor(f'{path} {n}')}) | {_cell(c.get_short_help_str(200))} |"
                  for n, c in subs if c is not None and not c.hidden]
        lines.append("")
    if any(isinstance(p, click.Option) for p in cmd.params) or not isinstance(cmd, click.Group):
        lines += _options_table(cmd, ctx)
        lines.append("")
    return "\n".join(lines)


def _anchor(path: str) -> str:
    """The id Python-Markdown's toc gives the heading "`<path>`" (lowercase, spaces to dashes)."""
    return path.lower().replace(" ", "-")


def cli_reference_markdown(group: click.Command | None = None) -> str:
    """The whole CLI reference for `group` (default: the `hil` command of hil/cli.py)."""
    if group is None:
        from hil.cli import main as group
    return "\n".join(command_markdown(path, cmd) for path, cmd in walk(group))
