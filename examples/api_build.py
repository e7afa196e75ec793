"""Build a lumi-g-ext image from a build script with the Python API.

Usage (on LUMI, or anywhere with Apptainer and the base image)::

    python examples/api_build.py my-image.sif --conda-env examples/minimal/env.yml

Add ``--dry-run`` to only print the plan.
"""

import argparse
import sys

import cotainr_lumi


def main(argv=None):
    """Parse arguments, build, and print what was built."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image")
    parser.add_argument("--system", default="lumi-g-ext")
    parser.add_argument("--conda-env")
    parser.add_argument("--base-image-override")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    try:
        result = cotainr_lumi.build(
            image_path=args.image,
            system=args.system,
            conda_env=args.conda_env,
            base_image_override=args.base_image_override,
            accept_licenses=True,
            force=args.force,
            dry_run=args.dry_run,
            setup_logging=True,
        )
    except cotainr_lumi.CotainrLumiError as e:
        print(f"build failed: {e}", file=sys.stderr)
        return 1
    if result.dry_run:
        print(result.plan_text)
        return 0
    print(f"built {result.image_path} in {result.duration:.0f} s")
    for report in result.reports:
        print(f"  {report.name}: {report.summary} ({report.duration:.1f} s)")
    for key, value in sorted(result.labels.items()):
        print(f"  label {key} = {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
